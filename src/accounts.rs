//! `bspweb user …` (administrators manage accounts) and `bspweb passwd`
//! (everyone changes their own password).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::Context;
use bsp_api::rest::{CreateUserRequest, QuotaChange, Role, UpdateUserRequest, UserInfo};
use clap::{Args, Subcommand};

use crate::cli_client::{self, Session, coded, connect, exit, usage};

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create an account; prints a generated password unless
    /// --password-stdin gives one
    Add(AddArgs),
    /// List the accounts with their role, standing, quotas and usage
    List(ListArgs),
    /// Set an account's password (its logins end); prints a generated one
    /// unless --password-stdin gives one
    Passwd(PasswdArgs),
    /// Disable an account: it cannot log in, its logins end at once, its
    /// waiting jobs wait; running jobs go on
    Disable(NameArg),
    /// Enable a disabled account again
    Enable(NameArg),
    /// Change an account's role or quotas (0: no limit)
    Set(SetArgs),
}

#[derive(Args)]
pub struct AddArgs {
    /// Account name: 1 to 64 of letters, digits, `_`, `.` and `-`
    name: String,
    /// admin (manages accounts), user (runs jobs) or volunteer (donates
    /// computers, runs no jobs)
    #[arg(long, default_value = "user", value_parser = parse_role)]
    role: Role,
    /// Read the password from the first line of standard input instead of
    /// generating one
    #[arg(long)]
    password_stdin: bool,
    #[command(flatten)]
    quotas: QuotaArgs,
    /// Print the new account as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ListArgs {
    /// Print a JSON array
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct PasswdArgs {
    /// Account name
    name: String,
    /// Read the new password from the first line of standard input instead
    /// of generating one
    #[arg(long)]
    password_stdin: bool,
}

#[derive(Args)]
pub struct NameArg {
    /// Account name
    name: String,
}

#[derive(Args)]
pub struct SetArgs {
    /// Account name
    name: String,
    /// New role: admin, user or volunteer
    #[arg(long, value_parser = parse_role)]
    role: Option<Role>,
    #[command(flatten)]
    quotas: QuotaArgs,
    /// Print the changed account as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct QuotaArgs {
    /// Processes of the account's active jobs at once (0: no limit); a job
    /// that would go beyond waits
    #[arg(long, value_name = "N")]
    max_processes: Option<u32>,
    /// Programs the account may store (0: no limit)
    #[arg(long, value_name = "N")]
    max_programs: Option<u32>,
    /// Output of the account's jobs stored, in MiB (0: no limit)
    #[arg(long, value_name = "MIB")]
    max_output_mib: Option<u64>,
}

impl QuotaArgs {
    fn change(&self) -> QuotaChange {
        QuotaChange {
            max_processes: self.max_processes,
            max_programs: self.max_programs,
            max_output_mib: self.max_output_mib,
        }
    }
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s).ok_or_else(|| format!("`{s}` is no role; use admin, user or volunteer"))
}

pub async fn user(cmd: UserCommand) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    match cmd {
        UserCommand::Add(a) => {
            let (password, generated) = new_password(a.password_stdin)?;
            let user = client
                .create_user(&CreateUserRequest {
                    name: a.name.clone(),
                    password: password.clone(),
                    role: Some(a.role),
                    admin: false,
                    quotas: a.quotas.change(),
                })
                .await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&user)?);
            } else {
                println!("created the {} account `{}`", user.role, user.name);
            }
            if generated {
                eprintln!(
                    "its password: {password}\n(shown once; they change it with `bspweb passwd`)"
                );
            }
        }
        UserCommand::List(a) => {
            let users = client.users().await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&users)?);
            } else {
                print!("{}", table(&users));
            }
        }
        UserCommand::Passwd(a) => {
            let (password, generated) = new_password(a.password_stdin)?;
            let user = client.set_password(&a.name, &password).await?;
            println!(
                "set the password of `{}`; its earlier logins have ended",
                user.name
            );
            if generated {
                eprintln!("the new password: {password}\n(shown once)");
            }
        }
        UserCommand::Disable(a) => {
            let user = client
                .update_user(
                    &a.name,
                    &UpdateUserRequest {
                        disabled: Some(true),
                        ..Default::default()
                    },
                )
                .await?;
            println!(
                "disabled `{}`: it cannot log in and its logins have ended",
                user.name
            );
        }
        UserCommand::Enable(a) => {
            let user = client
                .update_user(
                    &a.name,
                    &UpdateUserRequest {
                        disabled: Some(false),
                        ..Default::default()
                    },
                )
                .await?;
            println!("enabled `{}`", user.name);
        }
        UserCommand::Set(a) => {
            let change = UpdateUserRequest {
                role: a.role,
                disabled: None,
                quotas: a.quotas.change(),
            };
            if change == UpdateUserRequest::default() {
                return Err(usage(
                    "nothing to change: give --role, --max-processes, --max-programs or --max-output-mib",
                ));
            }
            let user = client.update_user(&a.name, &change).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&user)?);
            } else {
                print!("{}", table(std::slice::from_ref(&user)));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The accounts as a table; quotas of 0 show as `-` (no limit).
fn table(users: &[UserInfo]) -> String {
    let limit = |used: String, max: u64| {
        if max == 0 {
            format!("{used}/-")
        } else {
            format!("{used}/{max}")
        }
    };
    let mut out = format!(
        "{:<20} {:<9} {:<8} {:>11} {:>9} {:>17}\n",
        "NAME", "ROLE", "STATE", "PROCESSES", "PROGRAMS", "OUTPUT MIB"
    );
    for u in users {
        let usage = u.usage.unwrap_or_default();
        out.push_str(&format!(
            "{:<20} {:<9} {:<8} {:>11} {:>9} {:>17}\n",
            u.name,
            u.role,
            if u.disabled { "disabled" } else { "enabled" },
            limit(
                usage.processes.to_string(),
                u64::from(u.quotas.max_processes)
            ),
            limit(usage.programs.to_string(), u64::from(u.quotas.max_programs)),
            limit(
                format!("{:.1}", usage.output_bytes as f64 / f64::from(1 << 20)),
                u.quotas.max_output_mib
            ),
        ));
    }
    out
}

/// A password from standard input's first line, or a generated one
/// (`true`).
fn new_password(from_stdin: bool) -> anyhow::Result<(String, bool)> {
    if from_stdin {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .context("cannot read the password from standard input")?;
        let password = line.trim_end_matches(['\r', '\n']).to_string();
        if password.is_empty() {
            return Err(usage(
                "--password-stdin: standard input gave no password (one line, 8 to 1024 characters)",
            ));
        }
        return Ok((password, false));
    }
    use rand::Rng as _;
    const ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut rng = rand::rng();
    let password = (0..20)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    Ok((password, true))
}

#[derive(Args)]
pub struct OwnPasswdArgs {
    /// Read the current and the new password from the first two lines of
    /// standard input (without a terminal this is the default)
    #[arg(long)]
    stdin: bool,
}

/// `bspweb passwd`: change one's own password, keep the CLI logged in.
pub async fn passwd(a: OwnPasswdArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect().await?;
    let interactive = !a.stdin && std::io::stdin().is_terminal();
    let (current, new) = if interactive {
        let current =
            rpassword::prompt_password("current password: ").context("cannot read the password")?;
        let new =
            rpassword::prompt_password("new password: ").context("cannot read the password")?;
        let again = rpassword::prompt_password("new password again: ")
            .context("cannot read the password")?;
        if new != again {
            return Err(usage("the two new passwords differ; nothing was changed"));
        }
        (current, new)
    } else {
        let mut lines = std::io::stdin().lines();
        let mut next = |what: &str| -> anyhow::Result<String> {
            lines
                .next()
                .transpose()
                .context("cannot read standard input")?
                .map(|l| l.trim_end_matches('\r').to_string())
                .ok_or_else(|| {
                    usage(format!(
                        "standard input ended before the {what} password (give the current password on the first line, the new one on the second)"
                    ))
                })
        };
        (next("current")?, next("new")?)
    };
    let login = client
        .change_password(&current, &new)
        .await
        .map_err(|e| match e {
            bsp_api::client::ClientError::Unauthorized { message, .. } => coded(
                exit::UNAUTHORIZED,
                format!("the password was not changed: {message}"),
            ),
            e => e.into(),
        })?;
    // Keep this CLI logged in: the saved session's token has just ended.
    let saved = cli_client::load_session()
        .filter(|s| s.url == client.base_url() && s.user == login.user.name);
    if saved.is_some() {
        cli_client::save_session(&Session {
            url: client.base_url().to_string(),
            user: login.user.name.clone(),
            token: login.token,
            expires_at: login.expires_at,
            tls: saved.map(|s| s.tls).unwrap_or_default(),
        })?;
    }
    println!(
        "changed the password of `{}`; your other logins have ended",
        login.user.name
    );
    if std::env::var_os("BSPWEB_PASSWORD").is_some() {
        eprintln!("note: BSPWEB_PASSWORD still holds the old password; update it");
    }
    let _ = std::io::stdout().flush();
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bsp_api::rest::{Quotas, Usage};

    #[test]
    fn the_account_table_lines_up() {
        let user = |name: &str, role| UserInfo {
            id: 1,
            name: name.into(),
            admin: role == Role::Admin,
            role,
            disabled: false,
            quotas: Quotas {
                max_processes: 0,
                max_programs: 1000,
                max_output_mib: 4096,
            },
            usage: Some(Usage::default()),
            created_at: 0,
        };
        let text = table(&[user("a", Role::Admin), user("vera", Role::Volunteer)]);
        let lines: Vec<&str> = text.lines().collect();
        let col = |l: &str, word: &str| l.find(word).unwrap();
        assert_eq!(col(lines[0], "ROLE"), col(lines[1], "admin"));
        assert_eq!(col(lines[0], "ROLE"), col(lines[2], "volunteer"));
        assert_eq!(col(lines[1], "enabled"), col(lines[2], "enabled"));
        assert!(lines[1].contains("0/-"), "{text}");
    }
}
