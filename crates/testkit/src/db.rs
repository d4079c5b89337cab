//! Isolated databases on the shared MariaDB, and a guard for global server variables.

use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, Pool};

use crate::binlog::current_binlog_position;
use crate::env::mysql_url;
use crate::unique::unique_suffix;
use crate::watchdog::Watchdog;
use outbox_relay_core::position::BinlogPosition;

/// The repository's `migrations/` folder (the SQL files the relay's users apply).
pub fn migrations_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("migrations")
}

/// The migration files, in the order they are applied.
pub const MIGRATIONS: [&str; 3] = [
    "0001_outbox.sql",
    "0002_checkpoint.sql",
    "0003_checkpoint_layouts.sql",
];

/// A database of its own for one test, with both migrations applied (tables `outbox` and
/// `outbox_relay_checkpoint`).
///
/// The database is left in place when the value is dropped (useful after a failure); call
/// [`TestDb::drop_database`] to remove it.
pub struct TestDb {
    name: String,
    /// `mysql://user@host:port` of the server (no database).
    server_url: String,
    pool: Pool,
    created_at: BinlogPosition,
    /// Ends the test binary if the test that made this database hangs (see [`Watchdog`]).
    _watchdog: Watchdog,
}

impl TestDb {
    /// Creates a database named `<prefix>_<unique suffix>` and applies `migrations/0001_outbox.sql`
    /// and `migrations/0002_checkpoint.sql` inside it.
    ///
    /// # Errors
    /// The server cannot be reached, the name is too long (prefix over ~40 characters) or a
    /// migration fails.
    pub async fn create(prefix: &str) -> Result<Self> {
        Self::create_on(&mysql_url(None), prefix).await
    }

    /// Like [`TestDb::create`], on the server at `server_url` (`mysql://root@127.0.0.1:3366`,
    /// no database part): a private server of one test binary.
    ///
    /// # Errors
    /// As [`TestDb::create`].
    pub async fn create_on(server_url: &str, prefix: &str) -> Result<Self> {
        let server_url = server_url.trim_end_matches('/').to_owned();
        let name = format!("{prefix}_{}", unique_suffix());
        ensure!(
            name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "database name {name:?} must be at most 64 characters of [A-Za-z0-9_]"
        );
        let mut admin = Conn::from_url(&server_url)
            .await
            .with_context(|| format!("connecting to MariaDB at {server_url}"))?;
        admin
            .query_drop(format!(
                "CREATE DATABASE `{name}` DEFAULT CHARACTER SET utf8mb4"
            ))
            .await
            .with_context(|| format!("creating database {name}"))?;
        admin.disconnect().await.ok();

        let pool = Pool::new(Opts::from_url(&format!("{server_url}/{name}"))?);
        let db = Self {
            server_url,
            created_at: BinlogPosition {
                file: String::new(),
                pos: 0,
            },
            name,
            pool,
            _watchdog: Watchdog::arm(),
        };
        let mut conn = db.conn().await?;
        db.apply_migrations(&mut conn).await?;
        let created_at = current_binlog_position(&mut conn).await?;
        drop(conn);
        Ok(Self { created_at, ..db })
    }

    async fn apply_migrations(&self, conn: &mut Conn) -> Result<()> {
        let dir = migrations_dir();
        for file in MIGRATIONS {
            let path = dir.join(file);
            let sql = std::fs::read_to_string(&path)
                .with_context(|| format!("reading migration {}", path.display()))?;
            conn.query_drop(&sql)
                .await
                .with_context(|| format!("applying {} in {}", path.display(), self.name))?;
        }
        Ok(())
    }

    /// Creates `'user'@'%'` (`REQUIRE require`: `NONE`, `SSL`, `X509`) with exactly the grants
    /// the book documents for a least-privileged relay user of this database
    /// (docs/src/server-setup.md): MariaDB 10.5+ names BINLOG MONITOR and friends, MySQL 8.0 REPLICATION
    /// CLIENT; SELECT on `outbox`, SELECT, INSERT, UPDATE on `outbox_relay_checkpoint`. On MySQL
    /// 8.0 the user gets the server's default authentication, caching_sha2_password. The caller
    /// drops the user (users are not part of the database).
    ///
    /// # Errors
    /// A statement fails (the user exists already).
    pub async fn create_relay_user(&self, user: &str, password: &str, require: &str) -> Result<()> {
        let mut conn = self.conn().await?;
        let name = &self.name;
        let global = if crate::env::test_server().is_mysql() {
            "REPLICATION SLAVE, REPLICATION CLIENT"
        } else {
            "REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER ADMIN, REPLICA MONITOR"
        };
        for sql in [
            format!("CREATE USER '{user}'@'%' IDENTIFIED BY '{password}' REQUIRE {require}"),
            format!("GRANT {global} ON *.* TO '{user}'@'%'"),
            format!("GRANT SELECT ON `{name}`.`outbox` TO '{user}'@'%'"),
            format!(
                "GRANT SELECT, INSERT, UPDATE ON `{name}`.`outbox_relay_checkpoint` TO '{user}'@'%'"
            ),
        ] {
            conn.query_drop(&sql).await.with_context(|| sql.clone())?;
        }
        Ok(())
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connection URL with this database selected (what the relay's `mysql.url` should be).
    pub fn url(&self) -> String {
        format!("{}/{}", self.server_url, self.name)
    }

    /// `<db>.outbox`, as the relay's `outbox.tables` names it.
    pub fn outbox_table(&self) -> String {
        format!("{}.outbox", self.name)
    }

    /// A pool of connections with this database selected.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// A connection from [`TestDb::pool`].
    ///
    /// # Errors
    /// The server cannot be reached.
    pub async fn conn(&self) -> Result<Conn> {
        self.pool
            .get_conn()
            .await
            .with_context(|| format!("connecting to database {}", self.name))
    }

    /// The server's binlog end right after the migrations ran: a valid event start from which a
    /// binlog scan may begin (see [`crate::binlog::is_transaction_boundary`]).
    pub fn created_at_binlog(&self) -> &BinlogPosition {
        &self.created_at
    }

    /// Drops the database and closes the pool.
    ///
    /// # Errors
    /// The server cannot be reached.
    pub async fn drop_database(self) -> Result<()> {
        let mut conn = self.conn().await?;
        conn.query_drop(format!("DROP DATABASE IF EXISTS `{}`", self.name))
            .await?;
        drop(conn);
        self.pool.disconnect().await?;
        Ok(())
    }
}

/// Sets a global server variable (`SET GLOBAL name = value`) and puts the old value back.
///
/// Call [`GlobalVariableGuard::restore`] explicitly (before asserting, so a failed assertion
/// cannot skip it). If the guard is dropped without that (a panic, an early `?`), `Drop`
/// restores the value on a helper thread with its own runtime and waits for it.
pub struct GlobalVariableGuard {
    name: String,
    original: Option<String>,
    url: String,
}

impl GlobalVariableGuard {
    /// Saves `@@GLOBAL.<name>` and sets it to `value` (sent as an integer when it is one, as
    /// numeric variables refuse strings; else as a string literal).
    ///
    /// # Errors
    /// `name` is not a plain identifier, the server cannot be reached or refuses the value.
    pub async fn set(name: &str, value: &str) -> Result<Self> {
        ensure!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "not a variable name: {name:?}"
        );
        let url = mysql_url(None);
        let mut conn = Conn::from_url(&url).await?;
        let original: Option<String> = conn
            .query_first(format!("SELECT CAST(@@GLOBAL.{name} AS CHAR)"))
            .await?;
        let Some(original) = original else {
            bail!("@@GLOBAL.{name} has no value");
        };
        conn.exec_drop(format!("SET GLOBAL {name} = ?"), (variable_value(value),))
            .await
            .with_context(|| format!("SET GLOBAL {name} = {value:?}"))?;
        conn.disconnect().await.ok();
        Ok(Self {
            name: name.to_owned(),
            original: Some(original),
            url,
        })
    }

    /// The value the variable had before [`GlobalVariableGuard::set`].
    pub fn original(&self) -> Option<&str> {
        self.original.as_deref()
    }

    /// Puts the original value back.
    ///
    /// # Errors
    /// The server cannot be reached or refuses the value.
    pub async fn restore(mut self) -> Result<()> {
        match self.original.take() {
            Some(v) => restore_global(&self.url, &self.name, &v).await,
            None => Ok(()),
        }
    }
}

/// A variable's value for `SET GLOBAL x = ?`: integers as integers, the rest as text.
fn variable_value(value: &str) -> mysql_async::Value {
    match value.parse::<i64>() {
        Ok(n) => mysql_async::Value::Int(n),
        Err(_) => mysql_async::Value::from(value),
    }
}

async fn restore_global(url: &str, name: &str, value: &str) -> Result<()> {
    let mut conn = Conn::from_url(url).await?;
    conn.exec_drop(format!("SET GLOBAL {name} = ?"), (variable_value(value),))
        .await
        .with_context(|| format!("restoring @@GLOBAL.{name} = {value:?}"))?;
    conn.disconnect().await.ok();
    Ok(())
}

impl Drop for GlobalVariableGuard {
    fn drop(&mut self) {
        let Some(value) = self.original.take() else {
            return;
        };
        let (url, name) = (self.url.clone(), self.name.clone());
        let restored = std::thread::spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(restore_global(&url, &name, &value))
        })
        .join();
        match restored {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not restore @@GLOBAL.{}: {e:#}", self.name),
            Err(_) => eprintln!("could not restore @@GLOBAL.{}: helper panicked", self.name),
        }
    }
}
