//! What a failed command reports: one line, with the causes the store's error carries,
//! and never the password of the store's URL.

use std::fmt;

/// A command that failed (exit status 1): the one line `durq: error: …` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    message: String,
    /// The output's reader went away (`durq list | head`): not worth a message.
    broken_pipe: bool,
}

impl CliError {
    /// An error saying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            broken_pipe: false,
        }
    }

    /// The message, on one line.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// This error with every trace of `url`'s password (as written, and decoded) and of
    /// `url` itself replaced, so the message can be printed.
    pub fn redact(self, url: &str) -> Self {
        CliError {
            message: redact(&self.message, url),
            ..self
        }
    }

    /// Whether writing the output failed because its reader went away.
    pub fn is_broken_pipe(&self) -> bool {
        self.broken_pipe
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

impl From<durq::Error> for CliError {
    /// The error's text followed by its sources' ("backend unavailable: connect: Connection
    /// refused (os error 111)"), each once, on one line.
    fn from(err: durq::Error) -> Self {
        let mut message = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !text.is_empty() && !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = cause.source();
        }
        CliError::new(one_line(&message))
    }
}

impl From<std::io::Error> for CliError {
    fn from(err: std::io::Error) -> Self {
        CliError {
            broken_pipe: err.kind() == std::io::ErrorKind::BrokenPipe,
            ..CliError::new(one_line(&err.to_string()))
        }
    }
}

/// The result of a command.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

/// `text` with its line breaks folded into spaces.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `message` with `url`, and the password in it (as written and percent-decoded),
/// replaced.
pub fn redact(message: &str, url: &str) -> String {
    let Some(password) = password_of(url) else {
        return message.to_owned();
    };
    let mut message = message.replace(url, &url.replacen(&password, "***", 1));
    for secret in [percent_decode(&password), password] {
        if !secret.is_empty() {
            message = message.replace(&secret, "***");
        }
    }
    message
}

/// The password of `scheme://user:password@host…`, as written in the URL.
fn password_of(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    (!password.is_empty()).then(|| password.to_owned())
}

/// `%xx` escapes decoded; anything not a valid escape is kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escape {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_as_written_and_decoded() {
        let url = "postgres://ada:s%40cret@db.example:5432/jobs";
        let message = format!("cannot reach {url}: password s@cret refused (s%40cret)");
        let redacted = redact(&message, url);
        assert!(!redacted.contains("s@cret"), "{redacted}");
        assert!(!redacted.contains("s%40cret"), "{redacted}");
        assert!(
            redacted.contains("postgres://ada:***@db.example:5432/jobs"),
            "{redacted}"
        );
        assert_eq!(
            redact("nothing to hide", "redis://127.0.0.1:6379"),
            "nothing to hide"
        );
        assert_eq!(
            password_of("redis://:pw@host:6379/0").as_deref(),
            Some("pw")
        );
        assert_eq!(password_of("redis://user@host"), None);
        assert_eq!(password_of("sqlite://a:b@c.db"), Some("b".to_owned()));
        assert_eq!(percent_decode("100%"), "100%");
    }

    #[test]
    fn store_errors_carry_their_causes_on_one_line() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused\nnow");
        let err = CliError::from(durq::Error::unavailable("connect", io));
        assert_eq!(err.message(), "backend unavailable: connect: refused now");
    }
}
