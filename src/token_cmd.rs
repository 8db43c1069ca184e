//! `bspweb token …`: the enrollment tokens a volunteer's peers log in with
//! (create, list, revoke).

use std::path::PathBuf;
use std::process::ExitCode;

use bsp_api::rest::EnrollmentInfo;
use clap::{Args, Subcommand};

use crate::cli_client::{connect, write_private};

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Create an enrollment token; peers started with it are yours. Its
    /// secret is shown (or written to --out) this once
    Create(CreateArgs),
    /// List your enrollment tokens (administrators: everyone's)
    List(ListArgs),
    /// Revoke an enrollment token: its peers are fenced at once, their
    /// processes restored elsewhere, and it enrolls nothing any more
    Revoke(RevokeArgs),
}

#[derive(Args)]
pub struct CreateArgs {
    /// What it is for, e.g. the machines that will use it
    #[arg(long, default_value = "peers")]
    name: String,
    /// Write the token to this file (readable by you only) instead of
    /// printing it
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

#[derive(Args)]
pub struct ListArgs {
    /// Print a JSON array instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RevokeArgs {
    /// The token's id (`bspweb token list`)
    id: i64,
}

pub async fn token(c: TokenCommand) -> anyhow::Result<ExitCode> {
    let client = connect().await?;
    match c {
        TokenCommand::Create(a) => {
            let created = client.create_enrollment(&a.name).await?;
            let e = &created.enrollment;
            let file = match &a.out {
                Some(path) => {
                    write_private(path, format!("{}\n", created.token.0).as_bytes())?;
                    println!(
                        "enrollment token #{} `{}` of {} written to {}",
                        e.id,
                        e.name,
                        e.owner,
                        path.display()
                    );
                    path.display().to_string()
                }
                None => {
                    println!(
                        "enrollment token #{} `{}` of {} (shown this once; the supernode keeps only its hash):\n\n  {}\n",
                        e.id, e.name, e.owner, created.token.0
                    );
                    println!("Save it in a file readable by you only, say FILE.");
                    "FILE".to_string()
                }
            };
            let url = client.base_url();
            println!("Start a peer with it:\n  bspweb peer --supernode {url} --token-file {file}");
            println!(
                "or install the peer as a service:\n  bspweb peer install --supernode {url} --token-file {file}"
            );
            println!("Revoke it with `bspweb token revoke {}`.", e.id);
        }
        TokenCommand::List(a) => {
            let tokens = client.enrollments().await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&tokens)?);
            } else {
                print_table(&tokens);
            }
        }
        TokenCommand::Revoke(a) => {
            client.revoke_enrollment(a.id).await?;
            println!(
                "enrollment token #{} is revoked: its peers are fenced and may not log in again",
                a.id
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(tokens: &[EnrollmentInfo]) {
    if tokens.is_empty() {
        println!("no enrollment tokens yet: `bspweb token create` makes one");
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    println!(
        "{:>4}  {:<24} {:<12} {:>6}  {:<10} STATE",
        "ID", "NAME", "OWNER", "ONLINE", "LAST USED"
    );
    for t in tokens {
        println!(
            "{:>4}  {:<24} {:<12} {:>6}  {:<10} {}",
            t.id,
            t.name.chars().take(24).collect::<String>(),
            t.owner.chars().take(12).collect::<String>(),
            t.peers_online,
            t.last_used_at.map_or("never".to_string(), |t| ago(t, now)),
            if t.revoked_at.is_some() {
                "revoked"
            } else {
                "active"
            }
        );
    }
}

/// How long before `now` the Unix milliseconds `ms` were, for people.
fn ago(ms: i64, now: i64) -> String {
    let s = (now - ms).max(0) / 1000;
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        3600..86_400 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages_for_people() {
        let now = 10_000_000_000;
        assert_eq!(super::ago(now, now), "0s ago");
        assert_eq!(super::ago(now + 5_000, now), "0s ago");
        assert_eq!(super::ago(now - 59_999, now), "59s ago");
        assert_eq!(super::ago(now - 61_000, now), "1m ago");
        assert_eq!(super::ago(now - 7_200_000, now), "2h ago");
        assert_eq!(super::ago(now - 3 * 86_400_000, now), "3d ago");
    }
}
