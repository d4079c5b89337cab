//! Errors, classified once: retry automatically, or stop and tell the operator what to do;
//! and what keeps them safe and bounded: passwords redacted ([`redact_url`],
//! [`redact_error`]), waits turned into errors ([`with_timeout`]).

use std::sync::Arc;
use std::time::Duration;

use crate::position::BinlogPosition;

/// The detail of a MySQL, Kafka or binlog error: the message the relay shows (what failed in an
/// operator's words, with the fix where known) and, when the error came from a driver or
/// client (mysql_async, rdkafka), that error itself, so that the cause chain
/// ([`std::error::Error::source`]) is kept for whoever inspects it. Reads as its message
/// (`Deref<Target = str>`).
#[derive(Debug, Clone)]
pub struct Cause {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Cause {
    /// A cause with `message` and no source.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
        }
    }

    /// The message shown to the operator.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl std::ops::Deref for Cause {
    type Target = str;
    fn deref(&self) -> &str {
        &self.message
    }
}

/// Everything that can stop or interrupt the relay.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The configuration is invalid; the message names the key. Not retried.
    #[error("configuration error: {0}")]
    Config(String),

    /// A server prerequisite is not met (a setting, a missing table, a privilege). Not retried:
    /// the operator must change the server.
    #[error(
        "server prerequisite not met: {setting}: expected {expected}, found {found}. Fix: {fix}"
    )]
    Prerequisite {
        /// The setting or object (`binlog_format`, `shop.outbox_relay_checkpoint`).
        setting: String,
        /// What the relay needs.
        expected: String,
        /// What the server has.
        found: String,
        /// How to fix it.
        fix: String,
    },

    /// A row on an outbox table that cannot become a Kafka record. Not retried: retrying would
    /// fail the same way, and skipping it would lose an event.
    #[error("cannot relay the row at {position} in {table}: {reason}")]
    Row {
        /// Where the row's rows event ends in the binlog.
        position: BinlogPosition,
        /// `database.table`.
        table: String,
        /// What is wrong and, where known, how to fix it.
        reason: String,
    },

    /// A MySQL/MariaDB error or lost connection. Retried with backoff from the last checkpoint.
    #[error("MySQL: {0}")]
    Mysql(#[source] Cause),

    /// A Kafka error (unreachable broker, delivery failed after librdkafka's retries). Retried
    /// with backoff from the last checkpoint.
    #[error("Kafka: {0}")]
    Kafka(#[source] Cause),

    /// The binlog stream broke in a way that retrying cannot fix (an undecodable event, a
    /// position the server no longer has).
    #[error("binlog: {0}")]
    Binlog(#[source] Cause),

    /// This instance no longer holds the connector's lease (its lease connection died, or
    /// another instance took over). Retried: the instance waits for the lease again and then
    /// resumes from the stored checkpoint.
    #[error("lease lost: {0}")]
    LeaseLost(String),

    /// Exactly-once: a newer producer with this connector's `transactional.id` fenced ours
    /// (KIP-98 `PRODUCER_FENCED`). The supervisor checks the lease: lost (another instance took
    /// over) → waits for it like [`RelayError::LeaseLost`]; still held (another connector
    /// shares the `transactional.id`) → stops, so the two never fence each other in turn.
    #[error("fenced: {0}")]
    Fenced(String),

    /// Exactly-once: this producer's own transaction outlived `transaction.timeout.ms` (the
    /// process was paused: SIGSTOP, a long GC-like pause, a frozen VM), so the transaction
    /// coordinator aborted it and bumped the producer epoch (KIP-98; librdkafka has no KIP-588
    /// epoch recovery), and the broker then answered with `PRODUCER_FENCED` or
    /// `INVALID_PRODUCER_EPOCH`. Not another producer: the supervisor checks the lease in MySQL:
    /// still held → a new producer (`init_transactions`) resumes from the progress topic's
    /// last committed point at once; lost → it waits for the lease like
    /// [`RelayError::LeaseLost`].
    #[error("transaction expired: {0}")]
    TransactionExpired(String),

    /// Exactly-once: `commit_transaction` ended without telling whether the transaction
    /// committed (its EndTxn answer was lost or late: librdkafka implements transaction protocol
    /// version 1 only, no KIP-890). The supervisor builds a new producer at once, whose
    /// `init_transactions` bumps the epoch (fencing the old EndTxn if it is still on its way)
    /// and completes or aborts the transaction, then reads the progress topic to learn whether
    /// `point` was committed, and goes on from the committed point.
    #[error("commit outcome unknown: {detail}")]
    CommitUnknown {
        /// What failed and how.
        detail: String,
        /// The resume point the commit carried (`file:pos (+rows_acked rows)`).
        point: String,
    },

    /// A command-line argument is unusable (a `--binlog` file that does not exist or is not a
    /// binlog file, a replay position or date-time that cannot be used). Not retried: the
    /// operator must change the command.
    #[error("invalid argument: {0}")]
    Argument(String),
}

impl RelayError {
    /// [`RelayError::Mysql`] with `message` (what failed, and the fix where known).
    pub fn mysql(message: impl Into<String>) -> Self {
        Self::Mysql(Cause::new(message))
    }

    /// [`RelayError::Kafka`] with `message`.
    pub fn kafka(message: impl Into<String>) -> Self {
        Self::Kafka(Cause::new(message))
    }

    /// [`RelayError::Binlog`] with `message`.
    pub fn binlog(message: impl Into<String>) -> Self {
        Self::Binlog(Cause::new(message))
    }

    /// Keeps `source` (the driver's or client's own error) as the cause of a MySQL, Kafka or
    /// binlog error; other errors are returned unchanged.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        if let Self::Mysql(c) | Self::Kafka(c) | Self::Binlog(c) = &mut self {
            c.source = Some(Arc::new(source));
        }
        self
    }

    /// `true` when the supervisor should reconnect and resume from the last checkpoint.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            Self::Mysql(_)
                | Self::Kafka(_)
                | Self::LeaseLost(_)
                | Self::Fenced(_)
                | Self::TransactionExpired(_)
                | Self::CommitUnknown { .. }
        )
    }

    /// Whether this is a failed login to the MySQL server ([`LOGIN_DENIED`]): a wrong user,
    /// password or client host, not a missing privilege.
    pub fn is_login_denied(&self) -> bool {
        matches!(self, Self::Prerequisite { setting, .. } if setting == LOGIN_SETTING)
    }

    /// Process exit code for this error (documented in docs/src/operations/running.md): 2 configuration or
    /// command-line argument, 3 server prerequisite, 1 anything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) | Self::Argument(_) => 2,
            Self::Prerequisite { .. } => 3,
            _ => 1,
        }
    }
}

/// MySQL error 1236 (ER_MASTER_FATAL_ERROR_READING_BINLOG): the requested binlog position or
/// GTID is not available (purged, or never existed).
pub const ER_MASTER_FATAL_ERROR_READING_BINLOG: u16 = 1236;

/// MySQL error 1047 (ER_UNKNOWN_COM_ERROR, "Unknown command"): the server does not implement the
/// command, e.g. a proxy or MySQL-compatible service answering COM_BINLOG_DUMP. (Galera uses the
/// same code, with a message naming WSREP, for a node not yet ready: that one is transient.)
pub const ER_UNKNOWN_COM_ERROR: u16 = 1047;

/// Server errors that mean "not allowed": ER_DBACCESS_DENIED_ERROR (1044),
/// ER_ACCESS_DENIED_ERROR (1045), ER_TABLEACCESS_DENIED_ERROR (1142),
/// ER_COLUMNACCESS_DENIED_ERROR (1143), ER_SPECIFIC_ACCESS_DENIED_ERROR (1227).
pub const ACCESS_DENIED: [u16; 5] = [1044, 1045, 1142, 1143, 1227];

/// Of [`ACCESS_DENIED`], the failed login (ER_ACCESS_DENIED_ERROR, "Access denied for user
/// 'u'@'h' (using password: YES)"): a wrong user, password or client host, or a user that
/// requires TLS; never a missing privilege.
pub const LOGIN_DENIED: u16 = 1045;

/// The `setting` of the [`RelayError::Prerequisite`] of a failed login ([`LOGIN_DENIED`]);
/// see [`RelayError::is_login_denied`].
pub const LOGIN_SETTING: &str = "login to the MySQL server (mysql.url's user and password)";

/// The global privileges the documentation (docs/src/server-setup.md) grants the relay's user
/// on MariaDB 10.5 and later (10.11, 11.4): the binlog dump, `SHOW BINARY LOGS` / `SHOW MASTER
/// STATUS`, `SHOW SLAVE HOSTS` (the server_id collision check) and `SHOW ALL SLAVES STATUS`
/// (`log_slave_updates` on a replica).
pub const MARIADB_GLOBAL_PRIVILEGES: [&str; 4] = [
    "REPLICATION SLAVE",
    "BINLOG MONITOR",
    "REPLICATION MASTER ADMIN",
    "REPLICA MONITOR",
];

/// The global privileges the documentation grants the relay's user on MySQL 8.0 (and MariaDB
/// before 10.5, where REPLICATION CLIENT still covers the monitoring statements).
pub const MYSQL_GLOBAL_PRIVILEGES: [&str; 2] = ["REPLICATION SLAVE", "REPLICATION CLIENT"];

/// Of [`ACCESS_DENIED`], the errors of one statement refused to a user that is logged in
/// (1142, 1143, 1227): the server names the privilege it wanted.
pub const STATEMENT_DENIED: [u16; 3] = [1142, 1143, 1227];

/// The privilege (and object) a server's "denied" message names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedPrivilege {
    /// `DELETE`, `CREATE`, `SUPER, REPLICATION CLIENT`.
    pub privilege: String,
    /// `` `shop`.`outbox` `` (as the server wrote it, quoted for a GRANT), when it names one.
    pub object: Option<String>,
}

impl DeniedPrivilege {
    /// `GRANT <privilege> ON <object> TO <account>` (`*.*` for a global privilege).
    pub fn grant(&self, account: &str) -> String {
        let on = self.object.as_deref().unwrap_or("*.*");
        format!("GRANT {} ON {on} TO {account}", self.privilege)
    }
}

/// Reads the privilege and object out of the server's message of error 1142 ("DELETE command
/// denied to user 'u'@'h' for table `shop`.`outbox`"; MySQL before 8.0.29: "… for table
/// 'outbox'"), 1143 ("SELECT command denied … for column 'c' in table 't'") and 1227 ("Access
/// denied; you need (at least one of) the SUPER, REPLICATION CLIENT privilege(s) for this
/// operation"). `None` for any other text.
pub fn denied_privilege(message: &str) -> Option<DeniedPrivilege> {
    if let Some((privilege, rest)) = message.split_once(" command denied to user ") {
        let object = rest
            .rsplit_once(" table ")
            .map(|(_, t)| t.trim().trim_end_matches('.'))
            .map(|t| {
                if t.starts_with('`') {
                    t.to_owned()
                } else {
                    // 'outbox' (MySQL names the table alone): quoted as an identifier.
                    format!("`{}`", t.trim_matches('\'').replace('`', "``"))
                }
            });
        return Some(DeniedPrivilege {
            privilege: privilege.trim().to_ascii_uppercase(),
            object,
        });
    }
    let rest = message.split_once("you need (at least one of) the ")?.1;
    let privilege = rest.split_once(" privilege")?.0.trim().to_owned();
    Some(DeniedPrivilege {
        privilege,
        object: None,
    })
}

/// Start of the message of a connection-level I/O failure, which
/// [`RelayError::at_mysql_address`] replaces by the server's address.
const CONNECTION_FAILED: &str = "connection failed: ";

/// A socket error in words an operator can act on (once: mysql_async's own text repeats
/// "Input/output error").
fn describe_io(io: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    let code = io
        .raw_os_error()
        .map(|c| format!(" (os error {c})"))
        .unwrap_or_default();
    match io.kind() {
        K::ConnectionRefused => format!(
            "connection refused{code}: nothing accepts connections there. Fix: start the \
             server, or correct the host and port in mysql.url"
        ),
        K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => format!(
            "the server closed the connection ({io}): it restarted or shut down, or the \
             connection was killed (KILL, wait_timeout, a proxy's idle timeout)"
        ),
        K::TimedOut => format!(
            "the connection timed out ({io}): check that the host is reachable from here \
             (routes, firewalls, security groups)"
        ),
        K::NotFound | K::AddrNotAvailable => {
            format!("the address cannot be used ({io}): check the host name in mysql.url")
        }
        _ => io.to_string(),
    }
}

impl RelayError {
    /// Names the server (`host:port`) in a connection-level MySQL failure: "MySQL:
    /// 127.0.0.1:3306: connection refused …". Other errors are returned unchanged.
    pub fn at_mysql_address(self, address: &str) -> Self {
        match self {
            Self::Mysql(m) => match m.strip_prefix(CONNECTION_FAILED) {
                Some(rest) => Self::Mysql(Cause {
                    message: format!("{address}: {rest}"),
                    source: m.source.clone(),
                }),
                None => Self::Mysql(m),
            },
            other => other,
        }
    }
}

impl From<mysql_async::Error> for RelayError {
    /// The driver's error in an operator's words (see [`describe_mysql`]), kept as the source.
    fn from(e: mysql_async::Error) -> Self {
        describe_mysql(&e).with_source(e)
    }
}

/// A mysql_async error as the relay reports it: purged binlogs, refused privileges, TLS and
/// connection failures named with their fix.
fn describe_mysql(e: &mysql_async::Error) -> RelayError {
    {
        match e {
            mysql_async::Error::Server(s) if s.code == ER_MASTER_FATAL_ERROR_READING_BINLOG => {
                RelayError::binlog(format!(
                    "the server cannot send the requested binlog position (error 1236: {}). \
                     The binlog file was probably purged or the server's binlog history was reset. \
                     Check `SHOW BINARY LOGS`; to continue, move this connector's checkpoint with \
                     `outbox-relay reset --config <file> --to earliest` or `--to latest` (events \
                     in between are not relayed)",
                    s.message
                ))
            }
            // A command the server does not implement will not appear by retrying.
            mysql_async::Error::Server(s)
                if s.code == ER_UNKNOWN_COM_ERROR && !s.message.contains("WSREP") =>
            {
                RelayError::Prerequisite {
                    setting: "binlog dump (COM_BINLOG_DUMP / COM_BINLOG_DUMP_GTID)".into(),
                    expected: "a MySQL or MariaDB server (or replica) that serves its binlog to \
                               replicas"
                        .into(),
                    found: format!(
                        "error 1047 (command not supported): {}",
                        crate::error::redact_error(&s.message)
                    ),
                    fix: "point mysql.url at the database server itself, not at a proxy or load \
                          balancer (ProxySQL, MySQL Router's read/write port, a cloud proxy), or \
                          at a MySQL-compatible service that offers binlog replication"
                        .into(),
                }
            }
            // A statement refused to a user that logged in: name the privilege and the object
            // the server named, not the whole list (the user may hold all of those).
            mysql_async::Error::Server(s) if STATEMENT_DENIED.contains(&s.code) => {
                let message = crate::error::redact_error(&s.message);
                let (expected, grant) = match denied_privilege(&s.message) {
                    Some(d) => (
                        format!(
                            "{} on {} for this statement",
                            d.privilege,
                            d.object.as_deref().unwrap_or("the object it names")
                        ),
                        format!("{}: ", d.grant("<the mysql.url user's account>")),
                    ),
                    None => (
                        "the privilege the server names in its message".into(),
                        String::new(),
                    ),
                };
                RelayError::Prerequisite {
                    setting: "privileges of the mysql.url user".into(),
                    expected,
                    found: format!("error {}: {message}", s.code),
                    fix: format!(
                        "grant it ({grant}SELECT CURRENT_USER() names the account; see the README, \
                         \"Least-privileged MySQL user\"), or run this with a user that holds it"
                    ),
                }
            }
            // A failed login is about the user and password, not privileges.
            mysql_async::Error::Server(s) if s.code == LOGIN_DENIED => RelayError::Prerequisite {
                setting: LOGIN_SETTING.into(),
                expected: "the server to accept the user and password".into(),
                found: format!(
                    "access denied (error 1045: {})",
                    crate::error::redact_error(&s.message)
                ),
                fix: "check the user in mysql.url and the password (mysql.password, or the \
                      URL's); a user created REQUIRE SSL or REQUIRE X509 also needs \
                      mysql.tls_mode (and for X509 mysql.tls_cert and mysql.tls_key)"
                    .into(),
            },
            // Access problems are the operator's to fix: retrying would only hide them.
            mysql_async::Error::Server(s) if ACCESS_DENIED.contains(&s.code) => {
                RelayError::Prerequisite {
                    setting: "privileges of the mysql.url user".into(),
                    expected: format!(
                        "a user that holds {} on *.* (MySQL 8.0; MariaDB 10.5+: {}), SELECT on \
                         the outbox tables and SELECT, INSERT, UPDATE on the checkpoint table",
                        MYSQL_GLOBAL_PRIVILEGES.join(", "),
                        MARIADB_GLOBAL_PRIVILEGES.join(", ")
                    ),
                    found: format!(
                        "error {}: {}",
                        s.code,
                        crate::error::redact_error(&s.message)
                    ),
                    fix: "grant what is missing (see docs/src/server-setup.md, \"Server \
                          set-up\")"
                        .into(),
                }
            }
            mysql_async::Error::Url(_) => RelayError::Config(format!("mysql.url: {e}")),
            mysql_async::Error::Io(mysql_async::IoError::Tls(tls))
                if is_tls_rejection(&tls.to_string()) =>
            {
                RelayError::Prerequisite {
                    setting: "TLS connection to the MySQL server (mysql.tls_mode, mysql.tls_ca, \
                              mysql.tls_cert, mysql.tls_key)"
                        .into(),
                    expected: "a server certificate signed by the CA in mysql.tls_ca (or the \
                               system trust store), issued for the host of mysql.url when \
                               tls_mode = \"verify_identity\"; and a client certificate the \
                               server accepts when the user requires one"
                        .into(),
                    found: format!(
                        "the TLS handshake failed: {}",
                        crate::error::redact_error(&tls.to_string())
                    ),
                    fix: "set mysql.tls_ca to the CA file that signed the server's certificate \
                          (the server's ssl_ca); when the certificate does not name the host of \
                          mysql.url, connect by a name it holds or use tls_mode = \"verify_ca\"; \
                          for a user created REQUIRE X509 set mysql.tls_cert and mysql.tls_key to \
                          a certificate signed by the server's ssl_ca (see docs/src/security.md, \"TLS \
                          to MySQL\")"
                        .into(),
                }
            }
            mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) => {
                RelayError::Prerequisite {
                    setting: "TLS on the MySQL server".into(),
                    expected: "a server that accepts TLS connections (mysql.tls_mode is \
                               required, verify_ca or verify_identity)"
                        .into(),
                    found: "the server does not offer TLS (have_ssl is not YES)".into(),
                    fix: "give the server a certificate (ssl_cert, ssl_key, ssl_ca in its \
                          configuration, then restart it), or set mysql.tls_mode = \"preferred\" \
                          or \"disabled\" to connect without encryption"
                        .into(),
                }
            }
            mysql_async::Error::Io(mysql_async::IoError::Io(io)) => {
                RelayError::mysql(format!("{CONNECTION_FAILED}{}", describe_io(io)))
            }
            _ => RelayError::mysql(crate::error::redact_error(&e.to_string())),
        }
    }
}

/// `true` when an error of the TLS handshake means the certificates or TLS settings are wrong
/// (OpenSSL: "certificate verify failed", an alert about a certificate from the server, no
/// common protocol version) rather than a connection lost in the middle of the handshake, which
/// is retried.
fn is_tls_rejection(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "certificate",
        "unknown ca",
        "alert",
        "wrong version number",
        "no protocols available",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// Awaits `fut` for at most `limit`; a half-open connection must not hang the relay.
///
/// # Errors
/// [`RelayError::Mysql`] naming `what` when the time is up.
pub async fn with_timeout<T>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, RelayError> {
    tokio::time::timeout(limit, fut).await.map_err(|_| {
        RelayError::mysql(format!("{what}: no answer within {} ms", limit.as_millis()))
    })
}

/// `url` with any password replaced by `***`, for logs and errors.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// Removes anything that looks like a connection URL's password from an error message.
pub fn redact_error(message: &str) -> String {
    message
        .split(' ')
        .map(|w| {
            if w.contains("://") {
                redact_url(w)
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("mysql://relay:s3cr@t@db:3306/shop"),
            "mysql://relay:***@db:3306/shop"
        );
        assert_eq!(redact_url("mysql://root@db/shop"), "mysql://root@db/shop");
        assert_eq!(
            redact_error("cannot connect to mysql://u:pw@h/db now"),
            "cannot connect to mysql://u:***@h/db now"
        );
    }

    fn server_error(code: u16, message: &str) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: message.into(),
            state: "08S01".into(),
        })
    }

    #[test]
    fn connection_refused_is_said_once_with_the_address_and_the_fix() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = RelayError::from(mysql_async::Error::Io(mysql_async::IoError::Io(io)));
        assert!(e.is_retriable());
        let text = e.at_mysql_address("db.internal:3306").to_string();
        assert!(
            text.starts_with("MySQL: db.internal:3306: connection refused"),
            "{text}"
        );
        assert!(text.contains("Fix: start the server"), "{text}");
        assert!(!text.contains("Input/output error"), "{text}");
        let other = RelayError::mysql("Lock wait timeout").at_mysql_address("h:1");
        assert_eq!(other.to_string(), "MySQL: Lock wait timeout");
    }

    #[test]
    fn command_not_supported_is_a_definite_error() {
        let e = RelayError::from(server_error(ER_UNKNOWN_COM_ERROR, "Unknown command"));
        assert!(!e.is_retriable(), "{e}");
        assert_eq!(e.exit_code(), 3);
        let text = e.to_string();
        assert!(text.contains("error 1047"), "{text}");
        assert!(text.contains("not at a proxy"), "{text}");
    }

    #[test]
    fn a_refused_statement_names_its_privilege_not_the_whole_list() {
        let e = RelayError::from(server_error(
            1142,
            "DELETE command denied to user 'relay'@'10.0.0.5' for table `shop`.`outbox`",
        ));
        assert_eq!(e.exit_code(), 3);
        let text = e.to_string();
        assert!(
            text.contains("expected DELETE on `shop`.`outbox` for this statement"),
            "{text}"
        );
        assert!(
            text.contains("GRANT DELETE ON `shop`.`outbox` TO <the mysql.url user's account>"),
            "{text}"
        );
        assert!(!text.contains("check the user and password"), "{text}");
        assert!(!text.contains("REPLICATION SLAVE"), "{text}");
        // A failed login still points at the user and password.
        let login = RelayError::from(server_error(
            1045,
            "Access denied for user 'relay'@'10.0.0.5' (using password: YES)",
        ))
        .to_string();
        assert!(
            login.contains("check the user in mysql.url and the password"),
            "{login}"
        );
        assert!(
            login.contains("access denied (error 1045: Access denied for user 'relay'@'10.0.0.5'"),
            "{login}"
        );
        // No privilege list: the user may hold them all.
        assert!(!login.contains("REPLICATION"), "{login}");
    }

    /// The global privileges named when one is missing are those the server set-up page grants,
    /// for each flavor.
    #[test]
    fn the_privilege_lists_are_the_ones_the_set_up_page_grants() {
        let page = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/src/server-setup.md"
        ))
        .expect("docs/src/server-setup.md");
        let granted: Vec<Vec<String>> = page
            .lines()
            .filter_map(|l| {
                l.trim()
                    .strip_prefix("GRANT ")?
                    .strip_suffix(" TO 'relay'@'%';")
            })
            .filter_map(|l| l.strip_suffix(" ON *.*"))
            .map(|l| l.split(", ").map(str::to_owned).collect())
            .collect();
        assert_eq!(
            granted,
            vec![
                MARIADB_GLOBAL_PRIVILEGES.map(str::to_owned).to_vec(),
                MYSQL_GLOBAL_PRIVILEGES.map(str::to_owned).to_vec()
            ],
            "the GRANT … ON *.* lines of docs/src/server-setup.md (MariaDB, then MySQL)"
        );
        let denied = RelayError::from(server_error(
            1044,
            "Access denied for user 'relay'@'%' to database 'shop'",
        ))
        .to_string();
        assert!(
            denied.contains(
                "REPLICATION SLAVE, REPLICATION CLIENT on *.* (MySQL 8.0; MariaDB 10.5+: \
                 REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER ADMIN, REPLICA MONITOR)"
            ),
            "{denied}"
        );
    }

    #[test]
    fn denied_messages_of_both_servers_are_read() {
        let d = |m: &str| denied_privilege(m).map(|d| (d.privilege, d.object));
        // MariaDB, MySQL 8.0.29+ and MySQL before it.
        assert_eq!(
            d("CREATE command denied to user 'r'@'h' for table `shop`.`outbox_relay_checkpoint`"),
            Some((
                "CREATE".into(),
                Some("`shop`.`outbox_relay_checkpoint`".into())
            ))
        );
        assert_eq!(
            d("DELETE command denied to user 'r'@'localhost' for table 'outbox'"),
            Some(("DELETE".into(), Some("`outbox`".into())))
        );
        assert_eq!(
            d("SELECT command denied to user 'r'@'h' for column 'c' in table 't'"),
            Some(("SELECT".into(), Some("`t`".into())))
        );
        assert_eq!(
            d(
                "Access denied; you need (at least one of) the SUPER, REPLICATION CLIENT \
               privilege(s) for this operation"
            ),
            Some(("SUPER, REPLICATION CLIENT".into(), None))
        );
        assert_eq!(d("Table 'shop.outbox' doesn't exist"), None);
        let grant = denied_privilege(
            "Access denied; you need (at least one of) the BINLOG \
                                      MONITOR privilege(s) for this operation",
        )
        .map(|d| d.grant("'relay'@'%'"));
        assert_eq!(
            grant.as_deref(),
            Some("GRANT BINLOG MONITOR ON *.* TO 'relay'@'%'")
        );
    }

    #[test]
    fn galera_node_not_ready_is_retried() {
        let e = RelayError::from(server_error(
            ER_UNKNOWN_COM_ERROR,
            "WSREP has not yet prepared node for application use",
        ));
        assert!(e.is_retriable(), "{e}");
    }

    #[test]
    fn driver_errors_are_kept_as_the_source() {
        use std::error::Error as _;
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = RelayError::from(mysql_async::Error::Io(mysql_async::IoError::Io(io)))
            .at_mysql_address("h:1");
        assert!(
            e.to_string().starts_with("MySQL: h:1: connection refused"),
            "{e}"
        );
        let inner = e
            .source()
            .and_then(|c| c.source())
            .expect("naming the address keeps the driver's error");
        assert!(
            inner.downcast_ref::<mysql_async::Error>().is_some(),
            "{inner:?}"
        );
        // A message of the relay's own has no driver error behind it.
        assert!(RelayError::mysql("no answer")
            .source()
            .and_then(|c| c.source())
            .is_none());
    }
}
