//! The SDK's error type and what `main` may return.

use core::fmt;

/// An error of a BSP program: a message for the user who started the job.
///
/// Like `anyhow::Error`, it deliberately does **not** implement
/// [`std::error::Error`], so that any standard error converts into it with `?`:
///
/// ```rust,no_run
/// fn parse(text: &str) -> bspweb::Result<u64> {
///     let n: u64 = text.trim().parse()?; // ParseIntError -> Error
///     if n == 0 {
///         return Err(bspweb::Error::msg("n must be positive"));
///     }
///     Ok(n)
/// }
/// # fn main() { let _ = parse("1"); }
/// ```
///
/// When `main` returns an `Err`, the job ends and the user sees the message.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
}

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = core::result::Result<T, E>;

impl Error {
    /// An error carrying `message`.
    pub fn msg(message: impl fmt::Display) -> Self {
        Error {
            message: message.to_string(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// This error with `context` in front: `"{context}: {self}"`.
    #[must_use]
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error {
            message: format!("{context}: {}", self.message),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.message, f)
    }
}

/// Any standard error converts, with its chain of sources joined by `": "`.
impl<E: std::error::Error> From<E> for Error {
    fn from(error: E) -> Self {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        Error { message }
    }
}

/// What a `#[bspweb::main]` function may return: `()` or `Result<(), E>` for
/// any `E: Display` (such as [`Error`], `String` or `anyhow::Error`).
#[diagnostic::on_unimplemented(
    message = "a `#[bspweb::main]` function must return `()` or `Result<(), E>` with `E: Display`, not `{Self}`",
    label = "returns `{Self}`"
)]
pub trait IntoOutcome {
    /// `Ok(())` if the program succeeded, else the message to abort the job
    /// with.
    fn into_outcome(self) -> core::result::Result<(), String>;
}

impl IntoOutcome for () {
    fn into_outcome(self) -> core::result::Result<(), String> {
        Ok(())
    }
}

impl<E: fmt::Display> IntoOutcome for core::result::Result<(), E> {
    fn into_outcome(self) -> core::result::Result<(), String> {
        self.map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("cannot read input")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn parse(s: &str) -> Result<u32> {
        Ok(s.parse::<u32>()?)
    }

    #[test]
    fn question_mark_converts_standard_errors() {
        assert_eq!(parse("7"), Ok(7));
        let e = parse("x").unwrap_err();
        assert_eq!(e.message(), "invalid digit found in string");
    }

    #[test]
    fn conversion_keeps_the_source_chain() {
        let e = Error::from(Outer(std::io::Error::other("disk gone")));
        assert_eq!(e.to_string(), "cannot read input: disk gone");
        assert_eq!(
            e.context("step 2").to_string(),
            "step 2: cannot read input: disk gone"
        );
    }

    #[test]
    fn outcomes() {
        assert_eq!(().into_outcome(), Ok(()));
        assert_eq!(Ok::<(), Error>(()).into_outcome(), Ok(()));
        assert_eq!(
            Err::<(), _>(Error::msg("bad input")).into_outcome(),
            Err("bad input".to_string())
        );
        assert_eq!(
            Err::<(), _>("plain str").into_outcome(),
            Err("plain str".to_string())
        );
        assert_eq!(format!("{:?}", Error::msg("x")), "\"x\"");
    }
}
