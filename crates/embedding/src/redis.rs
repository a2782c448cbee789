//! The Redis tier: rows beyond one machine's memory, in a Redis server or cluster
//! (HPS's `volatile_db`). Key `<prefix><table>:<key>`, value the row's raw little-endian
//! f32 bytes.
//!
//! Redis being down must not take the server with it: every call has a short timeout,
//! a failure drops the connection and marks the tier down for a back-off interval
//! (lookups then fall through to the default vector and the store's error counter
//! rises), and the next call after the interval reconnects — so service recovers by
//! itself when Redis returns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::cluster::{cluster_pipe, ClusterClient, ClusterConnection};
use redis::{Client, Connection};

use super::RemoteTier;
use triton_rust_core::error::{Error, Result};

const TIMEOUT: Duration = Duration::from_millis(200);
const BACKOFF: Duration = Duration::from_millis(500);

enum Target {
    Single(Client),
    Cluster(ClusterClient),
}

enum Conn {
    Single(Connection),
    // Boxed: a cluster connection is much larger than a single one.
    Cluster(Box<ClusterConnection>),
}

struct State {
    conn: Option<Conn>,
    down_until: Option<Instant>,
}

pub struct RedisTier {
    target: Target,
    prefix: String,
    state: Mutex<State>,
}

fn redis_err(e: redis::RedisError) -> Error {
    Error::unavailable(format!("redis: {e}"))
}

impl RedisTier {
    /// `redis:<host:port>` or `redis_cluster:<host:port>,<host:port>,...`, optionally
    /// followed by `;prefix=<p>`.
    pub fn from_spec(spec: &str) -> Result<Arc<dyn RemoteTier>> {
        let (body, prefix) = match spec.split_once(";prefix=") {
            Some((b, p)) => (b, p.to_string()),
            None => (spec, String::new()),
        };
        let (kind, addrs) = body.split_once(':').ok_or_else(|| {
            Error::invalid_arg(format!(
                "volatile_db '{spec}': expected redis:<host:port> or redis_cluster:<host:port>,..."
            ))
        })?;
        let urls: Vec<String> =
            addrs.split(',').map(|a| format!("redis://{}/", a.trim())).collect();
        let target = match kind {
            "redis" if urls.len() == 1 => {
                Target::Single(Client::open(urls[0].as_str()).map_err(redis_err)?)
            }
            "redis_cluster" => Target::Cluster(
                ClusterClient::builder(urls)
                    .connection_timeout(TIMEOUT)
                    .response_timeout(TIMEOUT)
                    .build()
                    .map_err(redis_err)?,
            ),
            _ => {
                return Err(Error::invalid_arg(format!(
                    "volatile_db '{spec}': use redis:<host:port> or redis_cluster:<addresses>"
                )))
            }
        };
        Ok(Arc::new(RedisTier {
            target,
            prefix,
            state: Mutex::new(State { conn: None, down_until: None }),
        }))
    }

    fn connect(&self) -> Result<Conn> {
        match &self.target {
            Target::Single(c) => {
                let conn = c.get_connection_with_timeout(TIMEOUT).map_err(redis_err)?;
                conn.set_read_timeout(Some(TIMEOUT)).map_err(redis_err)?;
                conn.set_write_timeout(Some(TIMEOUT)).map_err(redis_err)?;
                Ok(Conn::Single(conn))
            }
            Target::Cluster(c) => {
                Ok(Conn::Cluster(Box::new(c.get_connection().map_err(redis_err)?)))
            }
        }
    }

    /// Runs `f` on a live connection; on failure drops it and backs off.
    fn with_conn<T>(&self, f: impl FnOnce(&mut Conn) -> redis::RedisResult<T>) -> Result<T> {
        let mut st = self.state.lock();
        if let Some(until) = st.down_until {
            if Instant::now() < until {
                return Err(Error::unavailable("redis is down (backing off before reconnecting)"));
            }
        }
        if st.conn.is_none() {
            match self.connect() {
                Ok(c) => st.conn = Some(c),
                Err(e) => {
                    st.down_until = Some(Instant::now() + BACKOFF);
                    return Err(e);
                }
            }
        }
        match f(st.conn.as_mut().expect("connected")) {
            Ok(v) => {
                st.down_until = None;
                Ok(v)
            }
            Err(e) => {
                st.conn = None;
                st.down_until = Some(Instant::now() + BACKOFF);
                Err(redis_err(e))
            }
        }
    }

    fn key(&self, table: &str, key: i64) -> String {
        format!("{}{table}:{key}", self.prefix)
    }
}

impl RemoteTier for RedisTier {
    fn get_many(
        &self,
        table: &str,
        dim: usize,
        keys: &[i64],
        out: &mut [f32],
        found: &mut [bool],
    ) -> Result<()> {
        let names: Vec<String> = keys.iter().map(|&k| self.key(table, k)).collect();
        let values: Vec<Option<Vec<u8>>> = self.with_conn(|conn| match conn {
            Conn::Single(c) => {
                let mut p = redis::pipe();
                for n in &names {
                    p.cmd("GET").arg(n);
                }
                p.query(c)
            }
            Conn::Cluster(c) => {
                let mut p = cluster_pipe();
                for n in &names {
                    p.cmd("GET").arg(n);
                }
                p.query(c)
            }
        })?;
        for (i, v) in values.into_iter().enumerate() {
            match v {
                Some(bytes) if bytes.len() == dim * 4 => {
                    for (o, c) in out[i * dim..(i + 1) * dim].iter_mut().zip(bytes.chunks_exact(4))
                    {
                        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                    found[i] = true;
                }
                // a value of the wrong size is not a row of this table: treat as absent
                _ => found[i] = false,
            }
        }
        Ok(())
    }

    fn set_many(&self, table: &str, dim: usize, keys: &[i64], vectors: &[f32]) -> Result<()> {
        let items: Vec<(String, &[u8])> = keys
            .iter()
            .zip(vectors.chunks_exact(dim))
            .map(|(&k, row)| (self.key(table, k), bytemuck::cast_slice::<f32, u8>(row)))
            .collect();
        self.with_conn(|conn| match conn {
            Conn::Single(c) => {
                let mut p = redis::pipe();
                for (n, v) in &items {
                    p.cmd("SET").arg(n).arg(*v).ignore();
                }
                p.query::<()>(c)
            }
            Conn::Cluster(c) => {
                let mut p = cluster_pipe();
                for (n, v) in &items {
                    p.cmd("SET").arg(n).arg(*v).ignore();
                }
                p.query::<()>(c)
            }
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}
