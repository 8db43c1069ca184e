//! Command-line flags of the benchmarks (`cargo bench --bench X -- --flag N`).

/// The number after `name` in `args`, if `name` is there; exits with a
/// message when it has no number or not a number.
pub fn flag_value(args: &[String], name: &str) -> Option<u32> {
    let i = args.iter().position(|a| a == name)?;
    let value = args.get(i + 1).unwrap_or_else(|| {
        eprintln!("error: {name} needs a number");
        std::process::exit(2)
    });
    Some(value.parse().unwrap_or_else(|_| {
        eprintln!("error: {name} {value}: not a number");
        std::process::exit(2)
    }))
}
