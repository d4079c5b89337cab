//! `outbox-relay fleet status`: every source of a fleet's configuration with its control-topic
//! partition, the process that owns it (the group member assigned that partition, from the
//! group coordinator's description), the lease holder and the checkpoint from the state
//! table (as `status` reads them), its lag, and a state: `running` (owned, lease held),
//! `waiting for lease` (owned, lease free: starting, or its previous owner is still being
//! timed out), `unowned` (no member holds the partition: no process runs, or a rebalance is
//! under way), `unknown` (the source's server could not be read: `error`). It needs no running
//! process of its own and changes nothing.
//!
//! The spread (sources per member, min and max) shows the statistical balance of the
//! name → partition mapping.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{json, Value};

use super::human_duration;
use super::status::{status, Status};
use outbox_relay_core::config::process::ProcessConfig;
use outbox_relay_core::error::RelayError;
use outbox_relay_kafka::fleet::{group_members, source_partition, GroupMember};

/// One source as `fleet status` sees it.
#[derive(Debug)]
pub struct SourceLine {
    /// Its name.
    pub name: String,
    /// Its control-topic partition.
    pub partition: i32,
    /// The member owning the partition (its `instance_id`), if any.
    pub owner: Option<String>,
    /// `status` of the source, or why it could not be read.
    pub status: Result<Status, String>,
}

impl SourceLine {
    /// `running`, `waiting for lease`, `unowned` or `unknown`.
    pub fn state(&self) -> &'static str {
        match (&self.owner, &self.status) {
            (None, _) => "unowned",
            (Some(_), Err(_)) => "unknown",
            (Some(_), Ok(s)) if s.lease_holder.is_some() => "running",
            (Some(_), Ok(_)) => "waiting for lease",
        }
    }
}

/// What `fleet status` found.
#[derive(Debug)]
pub struct FleetStatus {
    /// `fleet.group_id`.
    pub group: String,
    /// `fleet.control_topic`.
    pub topic: String,
    /// The control topic's partition count (the configured one if the topic does not exist).
    pub partitions: i32,
    /// Whether the control topic exists.
    pub topic_exists: bool,
    /// The group's members.
    pub members: Vec<GroupMember>,
    /// Every source of the configuration, in its order.
    pub sources: Vec<SourceLine>,
}

/// Gathers the fleet's status.
///
/// # Errors
/// [`RelayError::Config`] when the configuration has no `[fleet]`; [`RelayError::Kafka`] when
/// the group cannot be described. A source whose server cannot be read is a line of its own.
pub async fn fleet_status(process: &ProcessConfig) -> Result<FleetStatus, RelayError> {
    let Some(fleet) = &process.fleet else {
        return Err(RelayError::Config(
            "the configuration has no enabled [fleet] section: `fleet status` describes a fleet"
                .into(),
        ));
    };
    let (found, members) = group_members(fleet).await?;
    let partitions = found.unwrap_or(fleet.partitions);
    let mut sources = Vec::with_capacity(process.sources.len());
    for s in &process.sources {
        let partition = source_partition(&s.name, partitions);
        let owner = members
            .iter()
            .find(|m| m.partitions.contains(&partition))
            .map(|m| m.instance.clone());
        let status = status(&s.config).await.map_err(|e| e.to_string());
        sources.push(SourceLine {
            name: s.name.clone(),
            partition,
            owner,
            status,
        });
    }
    Ok(FleetStatus {
        group: fleet.group_id.clone(),
        topic: fleet.control_topic.clone(),
        partitions,
        topic_exists: found.is_some(),
        members,
        sources,
    })
}

impl FleetStatus {
    /// Sources per member, by instance (members without a source count 0).
    pub fn per_member(&self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> = self
            .members
            .iter()
            .map(|m| (m.instance.clone(), 0))
            .collect();
        for s in &self.sources {
            if let Some(owner) = &s.owner {
                *counts.entry(owner.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// The fewest and most sources of a member (`None` without members).
    pub fn spread(&self) -> Option<(usize, usize)> {
        let counts = self.per_member();
        Some((*counts.values().min()?, *counts.values().max()?))
    }

    /// The report as JSON (keys in docs/src/fleet.md).
    pub fn to_json(&self) -> Value {
        let sources: Vec<Value> = self
            .sources
            .iter()
            .map(|s| {
                let (lease, checkpoint, lag, error) = match &s.status {
                    Ok(st) => {
                        let row = st.row.as_ref();
                        (
                            json!({
                                "held": st.lease_holder.is_some(),
                                "holder_connection_id": st.lease_holder,
                                "owner": row.and_then(|r| r.lease_owner.clone()),
                                "token": row.map(|r| r.lease_token),
                            }),
                            row.and_then(|r| {
                                r.checkpoint.as_ref().map(|c| {
                                    json!({
                                        "binlog_file": c.position.file,
                                        "binlog_pos": c.position.pos,
                                        "rows_acked": c.rows_acked,
                                        "updated_at": r.updated_at,
                                        "age_seconds": (r.age_seconds * 1000.0).round() / 1000.0,
                                    })
                                })
                            })
                            .unwrap_or(Value::Null),
                            json!({"bytes": st.lag_bytes, "seconds": st.lag_seconds}),
                            Value::Null,
                        )
                    }
                    Err(e) => (Value::Null, Value::Null, Value::Null, json!(e)),
                };
                json!({
                    "name": s.name,
                    "partition": s.partition,
                    "owner": s.owner,
                    "state": s.state(),
                    "lease": lease,
                    "checkpoint": checkpoint,
                    "lag": lag,
                    "error": error,
                })
            })
            .collect();
        let members: Vec<Value> = self
            .members
            .iter()
            .map(|m| {
                json!({
                    "instance": m.instance,
                    "host": m.host,
                    "partitions": m.partitions,
                    "sources": self.sources.iter()
                        .filter(|s| s.owner.as_deref() == Some(m.instance.as_str()))
                        .map(|s| s.name.as_str()).collect::<Vec<_>>(),
                })
            })
            .collect();
        let spread = self
            .spread()
            .map(|(min, max)| json!({"min": min, "max": max}))
            .unwrap_or(Value::Null);
        json!({
            "group": self.group,
            "control_topic": self.topic,
            "partitions": self.partitions,
            "control_topic_exists": self.topic_exists,
            "members": members,
            "sources": sources,
            "spread": spread,
        })
    }
}

impl fmt::Display for FleetStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fleet {} on {} ({} partitions{}): {} members",
            self.group,
            self.topic,
            self.partitions,
            if self.topic_exists {
                ""
            } else {
                ", topic not created yet"
            },
            self.members.len()
        )?;
        for (instance, n) in self.per_member() {
            writeln!(f, "  member {instance}: {n} sources")?;
        }
        if let Some((min, max)) = self.spread() {
            writeln!(f, "  spread: {min} to {max} sources per member")?;
        }
        for s in &self.sources {
            write!(
                f,
                "{}  partition {}  owner {}  {}",
                s.name,
                s.partition,
                s.owner.as_deref().unwrap_or("-"),
                s.state()
            )?;
            match &s.status {
                Ok(st) => {
                    if let Some(r) = &st.row {
                        write!(
                            f,
                            "  lease {} (token {})",
                            r.lease_owner.as_deref().unwrap_or("-"),
                            r.lease_token
                        )?;
                        if let Some(c) = &r.checkpoint {
                            write!(
                                f,
                                "  checkpoint {} ({} ago)",
                                c.position,
                                human_duration(r.age_seconds)
                            )?;
                        }
                    }
                    if let Some(b) = st.lag_bytes {
                        write!(f, "  lag {b} bytes")?;
                    }
                }
                Err(e) => write!(f, "  error: {e}")?,
            }
            writeln!(f)?;
        }
        Ok(())
    }
}
