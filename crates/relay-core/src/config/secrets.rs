//! Secrets kept out of the config file: `${env:NAME}` and `${file:PATH}` references.
//!
//! The values of `mysql.url`, `mysql.password` and every `kafka.properties` entry may contain
//! references that are replaced when the configuration is loaded (the syntax of Kafka Connect's
//! config providers):
//!
//! * `${env:NAME}`: the value of environment variable `NAME` (it must be set; it may be empty);
//! * `${file:PATH}`: the content of file `PATH` (UTF-8) with one trailing line break removed
//!   (`\n` or `\r\n`), as secrets mounted by Docker or Kubernetes usually end with one;
//! * `$${` is a literal `${`.
//!
//! Errors name the configuration key and the variable or file, never the value, and never
//! echo the text around a reference (which may be part of a literal password).

use std::path::Path;

use crate::error::RelayError;

/// Replaces every `${env:NAME}` and `${file:PATH}` in `value`; `key` names the setting in
/// errors (`mysql.password`, `kafka.properties."sasl.password"`).
///
/// # Errors
/// [`RelayError::Config`] naming `key` when a variable is not set (or not UTF-8), a file cannot
/// be read, a reference is not closed, or `${` starts something other than `env:` or `file:`.
pub fn resolve(key: &str, value: &str) -> Result<String, RelayError> {
    if !value.contains("${") {
        return Ok(value.to_owned());
    }
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        if at > 0 && rest.as_bytes()[at - 1] == b'$' {
            // `$${` -> literal `${`
            out.push_str(&rest[..at - 1]);
            out.push_str("${");
            rest = &rest[at + 2..];
            continue;
        }
        out.push_str(&rest[..at]);
        let inner_start = at + 2;
        let Some(len) = rest[inner_start..].find('}') else {
            return Err(RelayError::Config(format!(
                "{key}: a \"${{\" is not closed by \"}}\"; write ${{env:NAME}} or \
                 ${{file:PATH}}, or $${{ for a literal \"${{\""
            )));
        };
        let reference = &rest[inner_start..inner_start + len];
        out.push_str(&lookup(key, reference)?);
        rest = &rest[inner_start + len + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn lookup(key: &str, reference: &str) -> Result<String, RelayError> {
    if let Some(name) = reference.strip_prefix("env:") {
        if name.is_empty() {
            return Err(RelayError::Config(format!(
                "{key}: ${{env:}} needs a variable name: ${{env:NAME}}"
            )));
        }
        return match std::env::var(name) {
            Ok(v) => Ok(v),
            Err(std::env::VarError::NotPresent) => Err(RelayError::Config(format!(
                "{key}: environment variable {name} (referenced as ${{env:{name}}}) is not set"
            ))),
            Err(std::env::VarError::NotUnicode(_)) => Err(RelayError::Config(format!(
                "{key}: environment variable {name} is not valid UTF-8"
            ))),
        };
    }
    if let Some(path) = reference.strip_prefix("file:") {
        if path.is_empty() {
            return Err(RelayError::Config(format!(
                "{key}: ${{file:}} needs a path: ${{file:/run/secrets/name}}"
            )));
        }
        return read_secret_file(key, Path::new(path));
    }
    Err(RelayError::Config(format!(
        "{key}: \"${{\" starts a reference that is neither ${{env:NAME}} nor ${{file:PATH}}; \
         write $${{ for a literal \"${{\""
    )))
}

fn read_secret_file(key: &str, path: &Path) -> Result<String, RelayError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        RelayError::Config(format!(
            "{key}: cannot read secret file {} ({e}); check the path and that the relay's user \
             may read it",
            path.display()
        ))
    })?;
    let trimmed = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    Ok(trimmed.to_owned())
}

/// `true` for `kafka.properties` keys whose values are secrets (passwords, SASL JAAS and OAuth
/// settings, inline private keys): shown as `***` in logs and debug output.
pub fn is_secret_property(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("secret")
        || k.contains("jaas")
        || k == "sasl.oauthbearer.config"
        || k == "ssl.key.pem"
        || k == "ssl_key"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_values_are_unchanged() {
        assert_eq!(
            resolve("k", "no refs $ { } $").expect("plain"),
            "no refs $ { } $"
        );
    }

    #[test]
    fn env_reference_is_replaced() {
        std::env::set_var("OUTBOX_RELAY_TEST_SECRET_A", "p@ss:w/rd");
        assert_eq!(
            resolve("mysql.password", "x${env:OUTBOX_RELAY_TEST_SECRET_A}y").expect("set"),
            "xp@ss:w/rdy"
        );
    }

    #[test]
    fn missing_env_names_the_key_and_the_variable() {
        let err = resolve(
            "kafka.properties.\"sasl.password\"",
            "${env:OUTBOX_RELAY_TEST_SECRET_NOT_SET}",
        )
        .expect_err("not set")
        .to_string();
        assert_eq!(
            err,
            "configuration error: kafka.properties.\"sasl.password\": environment variable \
             OUTBOX_RELAY_TEST_SECRET_NOT_SET (referenced as \
             ${env:OUTBOX_RELAY_TEST_SECRET_NOT_SET}) is not set"
        );
    }

    #[test]
    fn file_reference_is_read_without_its_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("outbox-relay-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let unix = dir.join("unix");
        let dos = dir.join("dos");
        let two = dir.join("two");
        std::fs::write(&unix, "s3cret\n").expect("write");
        std::fs::write(&dos, "s3cret\r\n").expect("write");
        std::fs::write(&two, "s3cret\n\n").expect("write");
        for (path, want) in [(&unix, "s3cret"), (&dos, "s3cret"), (&two, "s3cret\n")] {
            let v = format!("${{file:{}}}", path.display());
            assert_eq!(resolve("mysql.password", &v).expect("readable"), want);
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn missing_file_names_the_key_and_the_path() {
        let err = resolve("mysql.password", "${file:/nonexistent/outbox-relay/pw}")
            .expect_err("missing")
            .to_string();
        assert!(
            err.starts_with(
                "configuration error: mysql.password: cannot read secret file \
                 /nonexistent/outbox-relay/pw (No such file or directory"
            ),
            "{err}"
        );
    }

    #[test]
    fn dollar_dollar_is_a_literal_and_bad_references_do_not_echo_the_value() {
        assert_eq!(resolve("k", "a$${b}c").expect("escaped"), "a${b}c");
        let err = resolve("mysql.password", "hunter2${oops}")
            .expect_err("unknown provider")
            .to_string();
        assert!(!err.contains("hunter2") && !err.contains("oops"), "{err}");
        assert!(err.contains("mysql.password"), "{err}");
        let err = resolve("mysql.password", "hunter2${env:X")
            .expect_err("unclosed")
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("not closed"), "{err}");
    }

    #[test]
    fn secret_properties_are_recognised() {
        for k in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.jaas.config",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "ssl.key.pem",
        ] {
            assert!(is_secret_property(k), "{k}");
        }
        for k in [
            "sasl.username",
            "security.protocol",
            "ssl.ca.location",
            "linger.ms",
        ] {
            assert!(!is_secret_property(k), "{k}");
        }
    }
}
