//! The privilege an operator command's statement needs, named when the server refuses it:
//! the statement, the privilege and its object, the account (`CURRENT_USER()`), and the two
//! fixes (run the command as a user that holds it, or a GRANT line). The relay's own
//! least-privileged user (README, "Least-privileged MySQL user") may lack what `migrate` and
//! `prune` need; telling it to "check the user and password" would send the operator the wrong
//! way.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use outbox_relay_core::error::{denied_privilege, RelayError, STATEMENT_DENIED};

/// What one statement of a command needs, for the message when it is refused.
#[derive(Debug, Clone)]
pub(crate) struct Needed {
    /// The privileges, as GRANT takes them: `CREATE, ALTER`, `DELETE`.
    pub privileges: String,
    /// GRANT's object: `` `shop`.`outbox` ``.
    pub on: String,
    /// What the statement is for: "to delete relayed rows of shop.outbox".
    pub purpose: String,
    /// The statement as shown: its text up to the first line break, values as `?`.
    pub statement: String,
    /// How to run the same command as another user: "set mysql.url to … " (with the command
    /// line), or "give --database-url …".
    pub instead: String,
}

impl Needed {
    /// The error for `e`, the server's answer to this statement on `conn`: a
    /// [`RelayError::Prerequisite`] naming the statement, the privilege, the account and the
    /// fixes when the server refused it for want of a privilege; else `e` as
    /// [`RelayError::from`] describes it.
    pub(crate) async fn explain(&self, conn: &mut Conn, e: mysql_async::Error) -> RelayError {
        let mysql_async::Error::Server(s) = &e else {
            return RelayError::from(e);
        };
        if !STATEMENT_DENIED.contains(&s.code) && s.code != 1044 {
            return RelayError::from(e);
        }
        let message = outbox_relay_core::error::redact_error(&s.message);
        // The account the grant is for ('relay'@'%'), not the user@client-host the message
        // names ('relay'@'10.0.0.5'), which GRANT would not find.
        let account: Option<String> = conn
            .query_first("SELECT CURRENT_USER()")
            .await
            .ok()
            .flatten()
            .map(|a: String| quote_account(&a));
        let account_text = account
            .clone()
            .unwrap_or_else(|| "the mysql.url user".into());
        // The server's own word when it names another privilege than the one expected (a
        // server whose CREATE TABLE IF NOT EXISTS asks for more than CREATE).
        let privileges = match denied_privilege(&s.message) {
            Some(d) if !self.privileges.contains(&d.privilege) => {
                format!("{}, {}", self.privileges, d.privilege)
            }
            _ => self.privileges.clone(),
        };
        let grant = format!(
            "GRANT {privileges} ON {} TO {}",
            self.on,
            account.as_deref().unwrap_or("<the account>")
        );
        RelayError::Prerequisite {
            setting: format!("privileges of {account_text} for `{}`", command_line()),
            expected: format!("{privileges} on {} {}", self.on, self.purpose),
            found: format!(
                "the server refused the statement {} with error {}: {message}",
                self.statement, s.code
            ),
            fix: format!("{}; or, as an administrator: {grant}", self.instead),
        }
    }
}

/// [`Needed::instead`] for a command that takes `--config`: the same command line with
/// `OUTBOX_RELAY__MYSQL__URL` naming a user that may do `what`, so the file keeps the relay's
/// least-privileged user for `run`.
pub(crate) fn with_other_mysql_user(
    config: &outbox_relay_core::config::RelayConfig,
    what: &str,
) -> String {
    let url = other_user_url(&config.mysql.url);
    format!(
        "run it as a user that may {what}: OUTBOX_RELAY__MYSQL__URL='{url}' {}",
        command_line()
    )
}

/// `url` with its user and password replaced by `ADMIN:PASSWORD` placeholders.
fn other_user_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            format!("{scheme}://ADMIN:PASSWORD@{host}")
        }
        None => "mysql://ADMIN:PASSWORD@HOST:3306/DB".into(),
    }
}

/// `relay@%` (as `CURRENT_USER()` returns it) as GRANT takes it: `'relay'@'%'`.
fn quote_account(account: &str) -> String {
    let (user, host) = account.rsplit_once('@').unwrap_or((account, "%"));
    let q = |s: &str| format!("'{}'", s.replace('\'', "''"));
    format!("{}@{}", q(user), q(host))
}

/// This process's command line as typed (`outbox-relay migrate --config relay.toml`), the
/// program by its file name, passwords in URLs redacted, words with spaces or quotes quoted.
pub(crate) fn command_line() -> String {
    let mut args = std::env::args();
    let program = args
        .next()
        .and_then(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "outbox-relay".into());
    let mut words = vec![program];
    for a in args {
        let a = outbox_relay_core::error::redact_error(&a);
        let plain = a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,%+*".contains(c));
        words.push(if plain && !a.is_empty() {
            a
        } else {
            format!("'{}'", a.replace('\'', "'\\''"))
        });
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_are_quoted_for_grant() {
        assert_eq!(quote_account("relay@%"), "'relay'@'%'");
        assert_eq!(quote_account("o'neil@10.0.0.%"), "'o''neil'@'10.0.0.%'");
    }

    #[test]
    fn the_other_user_keeps_host_and_database() {
        assert_eq!(
            other_user_url("mysql://relay:secret@db:3306/shop?ssl-mode=required"),
            "mysql://ADMIN:PASSWORD@db:3306/shop?ssl-mode=required"
        );
        assert_eq!(
            other_user_url("mysql://db:3306/shop"),
            "mysql://ADMIN:PASSWORD@db:3306/shop"
        );
    }
}
