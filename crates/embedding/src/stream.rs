//! Following a Redis Stream of updates: HPS's `update_source` (Kafka there), on a
//! component that runs here. Training jobs append entries; every serving node reads the
//! whole stream through its own consumer group, applies each entry through the store's
//! durable update path, and acknowledges it only then.
//!
//! Entry fields: `table` (the table's name), `keys` (little-endian i64s) and `vectors`
//! (little-endian f32s, `dim` per key), e.g. from `examples/publish_updates.py`.
//! After a restart the group's pending entries (delivered, not acknowledged) are applied
//! first, then new ones: nothing is lost, and an entry applied twice writes the same
//! rows. An entry that cannot be applied (unknown table, wrong sizes) is logged, counted
//! and acknowledged, so it cannot block the stream.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::Value;
use triton_rust_core::error::{Error, Result};

/// Where to follow updates from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// `host:port` of the Redis server.
    pub addr: String,
    pub stream: String,
    /// This node's consumer group (each node reads every entry).
    pub group: String,
    /// Where a new group starts: `0` (the whole stream) or `$` (new entries only).
    pub start: String,
    /// Whether this node writes the stream's rows through to the Redis tier (`volatile_db`).
    /// Off where the publisher writes them once for every node (`update_stream_write_remote`).
    pub write_remote: bool,
}

impl StreamSpec {
    /// `redis:<host:port>/<stream>`.
    pub fn parse(spec: &str, group: String, start: String) -> Result<StreamSpec> {
        let bad = || {
            Error::invalid_arg(format!(
                "update_stream '{spec}': expected redis:<host:port>/<stream>"
            ))
        };
        let body = spec.strip_prefix("redis:").ok_or_else(bad)?;
        let (addr, stream) = body.split_once('/').ok_or_else(bad)?;
        if addr.is_empty() || stream.is_empty() || group.is_empty() {
            return Err(bad());
        }
        if start != "0" && start != "$" {
            return Err(Error::invalid_arg(format!(
                "update_stream_start must be 0 (whole stream) or $ (new entries); got '{start}'"
            )));
        }
        Ok(StreamSpec {
            addr: addr.to_string(),
            stream: stream.to_string(),
            group,
            start,
            write_remote: true,
        })
    }
}

/// What the follower has done, for metrics.
#[derive(Default)]
pub struct StreamCounters {
    pub applied_entries: AtomicU64,
    pub applied_rows: AtomicU64,
    pub rejected_entries: AtomicU64,
    pub errors: AtomicU64,
    /// Entries of the stream not yet delivered to this node's group (Redis's `lag`).
    pub lag: AtomicU64,
    /// Delivered, not yet acknowledged.
    pub pending: AtomicU64,
    pub connected: AtomicBool,
    /// `lag` and `pending` have been read from Redis at least once (until then they are
    /// unknown, not 0).
    pub measured: AtomicBool,
}

/// The follower thread; stops when dropped (or when the store goes).
pub struct StreamFollower {
    stop: Arc<AtomicBool>,
    pub counters: Arc<StreamCounters>,
}

impl Drop for StreamFollower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a stream's entries are written into (the store, which follows the stream): tables
/// found by name, rows written as an update that came from the stream.
pub trait StreamTarget: Send + Sync {
    /// The table named `name`: its index and dim.
    fn table_named(&self, name: &str) -> Option<(usize, usize)>;
    /// Writes rows into table `table` (`keys.len() × dim` values).
    fn write_rows(&self, table: usize, keys: &[i64], vectors: &[f32]) -> Result<()>;
}

impl StreamFollower {
    pub fn start(spec: StreamSpec, store: Weak<dyn StreamTarget>) -> Result<StreamFollower> {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(StreamCounters::default());
        let (flag, c) = (stop.clone(), counters.clone());
        std::thread::Builder::new()
            .name("embedding-stream".into())
            .spawn(move || follow(spec, store, flag, c))
            .map_err(|e| Error::internal(format!("cannot start the update stream thread: {e}")))?;
        Ok(StreamFollower { stop, counters })
    }
}

const BLOCK_MS: u64 = 500;
const BACKOFF: Duration = Duration::from_millis(500);

fn follow(
    spec: StreamSpec,
    store: Weak<dyn StreamTarget>,
    stop: Arc<AtomicBool>,
    c: Arc<StreamCounters>,
) {
    let mut errors_logged = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match session(&spec, &store, &stop, &c) {
            Ok(()) => return, // stopped, or the store is gone
            Err(e) => {
                c.connected.store(false, Ordering::Relaxed);
                let n = c.errors.fetch_add(1, Ordering::Relaxed);
                if n == 0 || n >= errors_logged * 10 {
                    log::warn!("update stream '{}' on {}: {e}; retrying", spec.stream, spec.addr);
                    errors_logged = n.max(1);
                }
                std::thread::sleep(BACKOFF);
            }
        }
    }
}

fn redis_err(e: redis::RedisError) -> Error {
    Error::unavailable(format!("redis: {e}"))
}

/// One connection's worth of following; returns Ok when told to stop.
fn session(
    spec: &StreamSpec,
    store: &Weak<dyn StreamTarget>,
    stop: &AtomicBool,
    c: &StreamCounters,
) -> Result<()> {
    let client = redis::Client::open(format!("redis://{}/", spec.addr)).map_err(redis_err)?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(1)).map_err(redis_err)?;
    conn.set_read_timeout(Some(Duration::from_millis(BLOCK_MS + 2000))).map_err(redis_err)?;
    match redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&spec.stream)
        .arg(&spec.group)
        .arg(&spec.start)
        .arg("MKSTREAM")
        .query::<Value>(&mut conn)
    {
        Ok(_) => log::info!(
            "update stream '{}': consumer group '{}' created at '{}'",
            spec.stream,
            spec.group,
            spec.start
        ),
        Err(e) if e.to_string().contains("BUSYGROUP") => {}
        Err(e) => return Err(redis_err(e)),
    }
    c.connected.store(true, Ordering::Relaxed);
    // Entries delivered before a restart but never acknowledged come first.
    let mut from = "0";
    while !stop.load(Ordering::Relaxed) {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP").arg(&spec.group).arg(&spec.group).arg("COUNT").arg(256);
        if from == ">" {
            cmd.arg("BLOCK").arg(BLOCK_MS);
        }
        let reply: Value =
            cmd.arg("STREAMS").arg(&spec.stream).arg(from).query(&mut conn).map_err(redis_err)?;
        let entries = entries_of(&reply);
        if entries.is_empty() && from == "0" {
            from = ">";
        }
        let Some(store) = store.upgrade() else { return Ok(()) };
        for (id, fields) in &entries {
            match apply(&*store, fields) {
                Ok(rows) => {
                    c.applied_entries.fetch_add(1, Ordering::Relaxed);
                    c.applied_rows.fetch_add(rows as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == triton_rust_core::ErrorKind::InvalidArg => {
                    c.rejected_entries.fetch_add(1, Ordering::Relaxed);
                    log::error!("update stream '{}': entry {id} skipped: {e}", spec.stream);
                }
                // not durable (disk): leave it pending and try again on the next session
                Err(e) => return Err(e),
            }
            redis::cmd("XACK")
                .arg(&spec.stream)
                .arg(&spec.group)
                .arg(id)
                .query::<Value>(&mut conn)
                .map_err(redis_err)?;
        }
        drop(store);
        let info: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&spec.stream)
            .query(&mut conn)
            .map_err(redis_err)?;
        if let Some((lag, pending)) = group_state(&info, &spec.group) {
            c.lag.store(lag, Ordering::Relaxed);
            c.pending.store(pending, Ordering::Relaxed);
            c.measured.store(true, Ordering::Relaxed);
        }
    }
    Ok(())
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn pairs(v: &Value) -> Vec<(&Value, &Value)> {
    match v {
        Value::Array(items) => items.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (k, v)).collect(),
        _ => Vec::new(),
    }
}

/// A stream entry: its id and its (field, value) pairs.
type Entry = (String, Vec<(String, Vec<u8>)>);

/// (id, fields) of every entry in an XREADGROUP reply (RESP2 arrays or RESP3 maps).
fn entries_of(reply: &Value) -> Vec<Entry> {
    let streams: Vec<&Value> = match reply {
        Value::Array(s) => {
            s.iter().filter_map(|s| if let Value::Array(p) = s { p.get(1) } else { None }).collect()
        }
        Value::Map(m) => m.iter().map(|(_, v)| v).collect(),
        _ => Vec::new(),
    };
    let mut out = Vec::new();
    for list in streams {
        let Value::Array(entries) = list else { continue };
        for e in entries {
            let Value::Array(parts) = e else { continue };
            let (Some(id), Some(fields)) = (parts.first().and_then(text), parts.get(1)) else {
                continue;
            };
            let fields = pairs(fields)
                .into_iter()
                .filter_map(|(k, v)| match v {
                    Value::BulkString(b) => text(k).map(|k| (k, b.clone())),
                    other => text(k).zip(text(other).map(String::into_bytes)),
                })
                .collect();
            out.push((id, fields));
        }
    }
    out
}

/// This group's (lag, pending) from XINFO GROUPS.
fn group_state(info: &Value, group: &str) -> Option<(u64, u64)> {
    let Value::Array(groups) = info else { return None };
    for g in groups {
        let fields = pairs(g);
        let get = |name: &str| {
            fields.iter().find(|(k, _)| text(k).as_deref() == Some(name)).map(|(_, v)| *v)
        };
        if get("name").and_then(text).as_deref() == Some(group) {
            let num =
                |name: &str| get(name).and_then(text).and_then(|s| s.parse().ok()).unwrap_or(0);
            return Some((num("lag"), num("pending")));
        }
    }
    None
}

/// Applies one entry; returns its row count. Malformed entries are `InvalidArg`.
fn apply(store: &dyn StreamTarget, fields: &[(String, Vec<u8>)]) -> Result<usize> {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
            .ok_or_else(|| Error::invalid_arg(format!("no field '{name}'")))
    };
    let name = String::from_utf8_lossy(field("table")?).into_owned();
    let (table, dim) = store
        .table_named(&name)
        .ok_or_else(|| Error::invalid_arg(format!("no table '{name}' in this store")))?;
    let (keys, vectors) = (field("keys")?, field("vectors")?);
    if keys.len() % 8 != 0 || vectors.len() != keys.len() / 8 * dim * 4 {
        return Err(Error::invalid_arg(format!(
            "table '{name}': {} bytes of keys and {} bytes of vectors do not make rows of dim {dim}",
            keys.len(),
            vectors.len()
        )));
    }
    let keys: Vec<i64> =
        keys.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8"))).collect();
    let vectors: Vec<f32> =
        vectors.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect();
    if let Some(i) = vectors.iter().position(|v| !v.is_finite()) {
        return Err(Error::invalid_arg(format!("table '{name}': value {i} is not finite")));
    }
    store.write_rows(table, &keys, &vectors).map_err(|e| {
        if e.kind() == triton_rust_core::ErrorKind::InvalidArg {
            e
        } else {
            Error::unavailable(e.message())
        }
    })?;
    Ok(keys.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_replies_parse() {
        let s =
            StreamSpec::parse("redis:127.0.0.1:6379/updates", "node-a".into(), "0".into()).unwrap();
        assert_eq!((s.addr.as_str(), s.stream.as_str()), ("127.0.0.1:6379", "updates"));
        assert!(StreamSpec::parse("kafka:x/y", "g".into(), "0".into()).is_err());
        assert!(StreamSpec::parse("redis:h:1/s", "g".into(), "latest".into()).is_err());
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            b("updates"),
            Value::Array(vec![Value::Array(vec![
                b("1-0"),
                Value::Array(vec![
                    b("table"),
                    b("t0"),
                    b("keys"),
                    Value::BulkString(vec![1, 0, 0, 0, 0, 0, 0, 0]),
                ]),
            ])]),
        ])]);
        let e = entries_of(&reply);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, "1-0");
        assert_eq!(e[0].1[1], ("keys".to_string(), vec![1, 0, 0, 0, 0, 0, 0, 0]));
        let info = Value::Array(vec![Value::Array(vec![
            b("name"),
            b("node-a"),
            b("pending"),
            Value::Int(2),
            b("lag"),
            Value::Int(5),
        ])]);
        assert_eq!(group_state(&info, "node-a"), Some((5, 2)));
        assert_eq!(group_state(&info, "node-b"), None);
    }
}
