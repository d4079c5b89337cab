//! Connection options for MySQL/MariaDB: `mysql.url`, `mysql.password` and TLS (`mysql.tls_*`).
//!
//! Every connection of the relay (the binlog dump, the pool used by start-up checks and the
//! checkpoint store, the lease connection) is made from the one [`Opts`] built here, so TLS
//! applies to all of them.
//!
//! TLS uses native-tls, i.e. the system's OpenSSL. The modes follow the MySQL client's
//! `--ssl-mode` (MySQL reference manual, "Command Options for Encrypted Connections"):
//!
//! | `tls_mode` | encrypted | server certificate checked |
//! | --- | --- | --- |
//! | `disabled` | no | - |
//! | `preferred` | when the server supports TLS, else plain | no |
//! | `required` | yes, or no connection | no |
//! | `verify_ca` | yes | signed by `tls_ca` (or a CA of the system trust store) |
//! | `verify_identity` | yes | as `verify_ca`, and issued for the host of `mysql.url` |
//!
//! `tls_cert` and `tls_key` (PEM) present a client certificate (for users created with
//! `REQUIRE X509`, `REQUIRE SUBJECT …` or `REQUIRE ISSUER …`).

use std::path::Path;
use std::time::Duration;

use mysql_async::{ClientIdentity, Conn, Opts, OptsBuilder, SslOpts};

use crate::config::{MysqlConfig, TlsMode};
use crate::error::RelayError;

/// Password of the in-memory PKCS#12 bundle that carries the client certificate to native-tls
/// (it never leaves the process).
const PKCS12_PASSWORD: &str = "outbox-relay";

/// The options of every connection to the source server: `mysql.url`, with `mysql.password`
/// in place of the URL's password when set, and the TLS settings. For `tls_mode = "preferred"`
/// these are the TLS options; [`resolve`] falls back to a plain connection when the server has
/// no TLS.
///
/// Reads and checks the TLS files (CA, client certificate and key).
///
/// # Errors
/// [`RelayError::Config`] naming the key: an invalid URL, TLS parameters in the URL, a TLS
/// file that cannot be read or parsed, a client key that does not match its certificate.
pub fn opts(config: &MysqlConfig) -> Result<Opts, RelayError> {
    let base = plain_opts(config)?;
    match ssl_opts(config)? {
        // Over TLS, stay on the TCP connection: mysql_async would otherwise move loopback
        // connections to the Unix socket, where it does not use TLS.
        Some(ssl) => Ok(OptsBuilder::from_opts(base)
            .ssl_opts(ssl)
            .prefer_socket(false)
            .into()),
        None => Ok(base),
    }
}

/// The URL's options with `mysql.password` applied, without TLS.
fn plain_opts(config: &MysqlConfig) -> Result<Opts, RelayError> {
    let url = Opts::from_url(&config.url).map_err(|e| {
        RelayError::Config(format!(
            "mysql.url is not a valid URL ({}); write it as \
             mysql://user:password@host:port/database, with characters such as @ : / # % in \
             the password percent-encoded (@ is %40), or put the password in mysql.password",
            crate::error::redact_error(&e.to_string())
        ))
    })?;
    if url.ssl_opts().is_some() {
        return Err(RelayError::Config(
            "mysql.url has TLS parameters (require_ssl, verify_ca, verify_identity or \
             built_in_roots): remove them and set mysql.tls_mode (and mysql.tls_ca, tls_cert, \
             tls_key) instead"
                .into(),
        ));
    }
    Ok(match &config.password {
        Some(p) => OptsBuilder::from_opts(url).pass(Some(p.clone())).into(),
        None => url,
    })
}

/// The `SslOpts` of `config`, `None` for `tls_mode = "disabled"`.
fn ssl_opts(config: &MysqlConfig) -> Result<Option<SslOpts>, RelayError> {
    let mode = config.tls_mode;
    if mode == TlsMode::Disabled {
        return Ok(None);
    }
    let mut ssl = SslOpts::default();
    match mode {
        TlsMode::Disabled => return Ok(None),
        TlsMode::Preferred | TlsMode::Required => {
            ssl = ssl.with_danger_accept_invalid_certs(true);
        }
        TlsMode::VerifyCa => ssl = ssl.with_danger_skip_domain_validation(true),
        TlsMode::VerifyIdentity => {}
    }
    if let Some(ca) = &config.tls_ca {
        let pem = read_file("mysql.tls_ca", ca)?;
        let certs = openssl::x509::X509::stack_from_pem(&pem).map_err(|e| {
            RelayError::Config(format!(
                "mysql.tls_ca: {} is not a PEM certificate file ({e})",
                ca.display()
            ))
        })?;
        if certs.is_empty() {
            return Err(RelayError::Config(format!(
                "mysql.tls_ca: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                ca.display()
            )));
        }
        // Only the given CA, like the mysql client's --ssl-ca.
        ssl = ssl
            .with_root_certs(vec![pem.into()])
            .with_disable_built_in_roots(true);
    }
    if let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) {
        ssl = ssl.with_client_identity(Some(
            ClientIdentity::new(client_pkcs12(cert, key)?.into()).with_password(PKCS12_PASSWORD),
        ));
    }
    Ok(Some(ssl))
}

fn read_file(key: &str, path: &Path) -> Result<Vec<u8>, RelayError> {
    std::fs::read(path).map_err(|e| {
        RelayError::Config(format!(
            "{key}: cannot read {} ({e}); check the path and that the relay's user may read it",
            path.display()
        ))
    })
}

/// The client certificate (chain) and key as the PKCS#12 bundle native-tls takes.
fn client_pkcs12(cert_path: &Path, key_path: &Path) -> Result<Vec<u8>, RelayError> {
    use openssl::pkey::PKey;
    use openssl::stack::Stack;
    use openssl::x509::X509;

    let cert_pem = read_file("mysql.tls_cert", cert_path)?;
    let key_pem = read_file("mysql.tls_key", key_path)?;
    let mut chain = X509::stack_from_pem(&cert_pem)
        .map_err(|e| {
            RelayError::Config(format!(
                "mysql.tls_cert: {} is not a PEM certificate file ({e})",
                cert_path.display()
            ))
        })?
        .into_iter();
    let Some(cert) = chain.next() else {
        return Err(RelayError::Config(format!(
            "mysql.tls_cert: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            cert_path.display()
        )));
    };
    // Never print the key or its parse error details beyond the path.
    let key = PKey::private_key_from_pem(&key_pem).map_err(|_| {
        RelayError::Config(format!(
            "mysql.tls_key: {} is not an unencrypted PEM private key (PKCS#8 \"PRIVATE KEY\", \
             PKCS#1 \"RSA PRIVATE KEY\" or SEC1 \"EC PRIVATE KEY\")",
            key_path.display()
        ))
    })?;
    let matches = cert
        .public_key()
        .map(|public| public.public_eq(&key))
        .unwrap_or(false);
    if !matches {
        return Err(RelayError::Config(format!(
            "mysql.tls_key: the key in {} does not belong to the certificate in {} (mysql.tls_cert)",
            key_path.display(),
            cert_path.display()
        )));
    }
    let mut builder = openssl::pkcs12::Pkcs12::builder();
    builder.name("outbox-relay").pkey(&key).cert(&cert);
    let rest: Vec<X509> = chain.collect();
    if !rest.is_empty() {
        let mut ca = Stack::new().map_err(tls_internal)?;
        for c in rest {
            ca.push(c).map_err(tls_internal)?;
        }
        builder.ca(ca);
    }
    builder
        .build2(PKCS12_PASSWORD)
        .and_then(|p| p.to_der())
        .map_err(tls_internal)
}

fn tls_internal(e: openssl::error::ErrorStack) -> RelayError {
    RelayError::Config(format!(
        "mysql.tls_cert/mysql.tls_key: cannot prepare the client certificate for TLS ({e})"
    ))
}

/// The options to connect with: [`opts`], except that for `tls_mode = "preferred"` one
/// connection is tried first and, when the server does not offer TLS, the plain options are
/// returned (logged). Other modes return [`opts`] without connecting.
///
/// # Errors
/// As [`opts`]; for `preferred`, the probe connection's error when it fails for another
/// reason (no answer within `timeout`, refused, TLS handshake failure).
pub async fn resolve(config: &MysqlConfig, timeout: Duration) -> Result<Opts, RelayError> {
    let opts = opts(config)?;
    if config.tls_mode != TlsMode::Preferred {
        return Ok(opts);
    }
    match crate::error::with_timeout(timeout, "connecting to MySQL", Conn::new(opts.clone()))
        .await?
    {
        Ok(conn) => {
            conn.disconnect().await.ok();
            tracing::info!("mysql.tls_mode = preferred: the server accepts TLS; using it");
            Ok(opts)
        }
        Err(mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)) => {
            tracing::warn!(
                "mysql.tls_mode = preferred: the server does not offer TLS; connecting \
                 WITHOUT encryption (set tls_mode = \"required\" or stricter to refuse this)"
            );
            plain_opts(config)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RelayConfig;

    fn config(mysql_extra: &str) -> Result<RelayConfig, RelayError> {
        RelayConfig::from_toml_str(&format!(
            "[mysql]\nurl = \"mysql://relay:urlpw@127.0.0.1:3306/shop\"\nserver_id = 7\n\
             {mysql_extra}\n[outbox]\ntables = [\"shop.outbox\"]\n[kafka]\n\
             bootstrap_servers = \"127.0.0.1:9092\"\n"
        ))
    }

    #[test]
    fn disabled_by_default_and_password_overrides_the_url() {
        let c = config("password = \"p@ss:/#\"").expect("valid");
        assert_eq!(c.mysql.tls_mode, TlsMode::Disabled);
        let o = opts(&c.mysql).expect("opts");
        assert!(o.ssl_opts().is_none());
        assert_eq!(o.pass(), Some("p@ss:/#"));
        assert_eq!(o.user(), Some("relay"));
        let c = config("").expect("valid");
        assert_eq!(opts(&c.mysql).expect("opts").pass(), Some("urlpw"));
    }

    #[test]
    fn modes_map_to_verification_settings() {
        for (mode, accept_invalid, skip_name) in [
            ("preferred", true, false),
            ("required", true, false),
            ("verify_ca", false, true),
            ("verify_identity", false, false),
        ] {
            let c = config(&format!("tls_mode = \"{mode}\"")).expect("valid");
            let o = opts(&c.mysql).expect("opts");
            let ssl = o.ssl_opts().expect("tls on");
            assert_eq!(ssl.accept_invalid_certs(), accept_invalid, "{mode}");
            assert_eq!(ssl.skip_domain_validation(), skip_name, "{mode}");
            assert!(
                !ssl.disable_built_in_roots(),
                "{mode}: system roots without tls_ca"
            );
            assert!(!o.prefer_socket(), "{mode}: TLS must stay on TCP");
        }
    }

    #[test]
    fn tls_parameters_in_the_url_are_refused() {
        let c = RelayConfig::from_toml_str(
            "[mysql]\nurl = \"mysql://r@h:3306/shop?require_ssl=true\"\nserver_id = 7\n\
             [outbox]\ntables = [\"shop.outbox\"]\n[kafka]\nbootstrap_servers = \"k:9092\"\n",
        );
        let err = c.expect_err("url tls").to_string();
        assert!(err.contains("mysql.tls_mode"), "{err}");
    }

    #[test]
    fn unreadable_or_invalid_tls_files_are_config_errors_naming_the_key() {
        let err = config("tls_mode = \"verify_ca\"\ntls_ca = \"/nonexistent/ca.pem\"")
            .expect_err("missing ca")
            .to_string();
        assert!(
            err.starts_with("configuration error: mysql.tls_ca: cannot read /nonexistent/ca.pem"),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("outbox-relay-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "hello").expect("write");
        let err = config(&format!(
            "tls_mode = \"verify_ca\"\ntls_ca = \"{}\"",
            not_pem.display()
        ))
        .expect_err("not pem")
        .to_string();
        assert!(err.contains("mysql.tls_ca") && err.contains("PEM"), "{err}");
        let err = config(&format!(
            "tls_mode = \"required\"\ntls_cert = \"{0}\"\ntls_key = \"{0}\"",
            not_pem.display()
        ))
        .expect_err("bad cert")
        .to_string();
        assert!(err.contains("mysql.tls_cert"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn inconsistent_tls_settings_are_refused() {
        for (extra, needle) in [
            ("tls_ca = \"/x/ca.pem\"", "mysql.tls_mode"),
            (
                "tls_mode = \"required\"\ntls_ca = \"/x/ca.pem\"",
                "verify_ca",
            ),
            (
                "tls_mode = \"verify_ca\"\ntls_cert = \"/x/c.pem\"",
                "mysql.tls_key",
            ),
            (
                "tls_mode = \"verify_ca\"\ntls_key = \"/x/k.pem\"",
                "mysql.tls_cert",
            ),
            ("tls_mode = \"on\"", "tls_mode"),
        ] {
            let err = config(extra).expect_err(extra).to_string();
            assert!(err.contains(needle), "{extra}: {err}");
        }
    }
}
