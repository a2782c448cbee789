//! The Redis tier: rows beyond one machine's memory, in a Redis server or cluster
//! (HPS's `volatile_db`). Key `<prefix><table>:<key>`, value the row's raw little-endian
//! f32 bytes.
//!
//! Redis being down must not take the server with it: every call has a short timeout,
//! a failure drops the connection and marks the tier down for a back-off interval
//! (lookups then fall through to the default vector and the store's error counter
//! rises), and the next call after the interval reconnects — so service recovers by
//! itself when Redis returns.
//!
//! A managed or shared Redis wants a login and TLS: `rediss:`/`rediss_cluster:` connect
//! over TLS (rustls; the system's roots, or the CA file of `Access::ca_file`), and
//! `Access::credential` logs in as an ACL user (`AUTH user password`) on every connection.
//! The credential comes from a file or an environment variable, never from the model's
//! config, and appears in no message or log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::cluster::{cluster_pipe, ClusterClient, ClusterConnection};
use redis::{Client, Connection, IntoConnectionInfo, TlsCertificates};

use triton_rust_core::error::{Error, Result};

/// Rows that live outside this machine (Redis). Misses are `found[i] = false`.
pub trait RemoteTier: Send + Sync {
    fn get_many(
        &self,
        table: &str,
        dim: usize,
        keys: &[i64],
        out: &mut [f32],
        found: &mut [bool],
    ) -> Result<()>;
    fn set_many(&self, table: &str, dim: usize, keys: &[i64], vectors: &[f32]) -> Result<()>;
    fn name(&self) -> &'static str;
}

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

/// An ACL login: user (`default` when the credential names none) and password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub user: String,
    pub password: String,
    /// Where it was read from, for messages: `file '/run/secrets/redis'`.
    pub source: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential(user '{}', password from {})", self.user, self.source)
    }
}

impl Credential {
    /// `user:password`, or a bare `password` for the `default` user (as Redis's
    /// `requirepass`); the user ends at the first colon, so a password of the default user
    /// that holds a colon is written `default:pass:word`. Surrounding whitespace (a file's
    /// last newline) is not part of it.
    pub fn parse(text: &str, source: String) -> Result<Credential> {
        let text = text.trim();
        if text.is_empty() {
            return Err(Error::invalid_arg(format!("the Redis credential from {source} is empty")));
        }
        let (user, password) = match text.split_once(':') {
            Some((user, password)) => (user.to_string(), password.to_string()),
            None => ("default".to_string(), text.to_string()),
        };
        if user.is_empty() || password.is_empty() {
            return Err(Error::invalid_arg(format!(
                "the Redis credential from {source} must be 'user:password' or a password; it has an empty {}",
                if user.is_empty() { "user" } else { "password" }
            )));
        }
        Ok(Credential { user, password, source })
    }
}

/// How to reach a Redis that asks for more than an address.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub credential: Option<Credential>,
    /// PEM certificates of the authorities a TLS server's certificate is checked against
    /// (`rediss:` only), in place of the system's roots: the file's path and its bytes.
    pub ca_file: Option<(String, Vec<u8>)>,
}

impl RedisTier {
    /// `redis:<host:port>`, `rediss:<host:port>` (TLS), `redis_cluster:<host:port>,...` or
    /// `rediss_cluster:<host:port>,...`, optionally followed by `;prefix=<p>`. Addresses
    /// hold no credential (`access` brings it).
    pub fn from_spec(spec: &str, access: &Access) -> Result<Arc<dyn RemoteTier>> {
        let (body, prefix) = match spec.split_once(";prefix=") {
            Some((b, p)) => (b, p.to_string()),
            None => (spec, String::new()),
        };
        let usage = "use redis:<host:port>, rediss:<host:port> (TLS), redis_cluster:<host:port>,... or rediss_cluster:<host:port>,...";
        let (kind, addrs) = body
            .split_once(':')
            .ok_or_else(|| Error::invalid_arg(format!("volatile_db '{spec}': {usage}")))?;
        if addrs.contains('@') || addrs.contains("//") {
            return Err(Error::invalid_arg(format!(
                "volatile_db: give addresses only (host:port), {usage}; a login goes in volatile_db_credential_file or volatile_db_credential_env, never in the config"
            )));
        }
        let (tls, cluster) = match kind {
            "redis" => (false, false),
            "rediss" => (true, false),
            "redis_cluster" => (false, true),
            "rediss_cluster" => (true, true),
            _ => return Err(Error::invalid_arg(format!("volatile_db '{spec}': {usage}"))),
        };
        if access.ca_file.is_some() && !tls {
            return Err(Error::invalid_arg(format!(
                "volatile_db '{spec}' is not TLS, yet volatile_db_tls_ca_file is set: use rediss: or rediss_cluster:"
            )));
        }
        let scheme = if tls { "rediss" } else { "redis" };
        let urls: Vec<String> =
            addrs.split(',').map(|a| format!("{scheme}://{}/", a.trim())).collect();
        let certs = || TlsCertificates {
            client_tls: None,
            root_cert: access.ca_file.as_ref().map(|(_, pem)| pem.clone()),
        };
        let target = if !cluster {
            let [url] = urls.as_slice() else {
                return Err(Error::invalid_arg(format!(
                    "volatile_db '{spec}': one address for {kind}: (several are a cluster: {kind}_cluster:)"
                )));
            };
            let mut info = url.as_str().into_connection_info().map_err(redis_err)?;
            if let Some(c) = &access.credential {
                let login =
                    info.redis_settings().clone().set_username(&c.user).set_password(&c.password);
                info = info.set_redis_settings(login);
            }
            let client = if access.ca_file.is_some() {
                Client::build_with_tls(info, certs())
            } else {
                Client::open(info)
            };
            Target::Single(client.map_err(redis_err)?)
        } else {
            let mut b =
                ClusterClient::builder(urls).connection_timeout(TIMEOUT).response_timeout(TIMEOUT);
            if let Some(c) = &access.credential {
                b = b.username(&c.user).password(&c.password);
            }
            if access.ca_file.is_some() {
                b = b.certs(certs());
            }
            Target::Cluster(b.build().map_err(redis_err)?)
        };
        let tier =
            RedisTier { target, prefix, state: Mutex::new(State { conn: None, down_until: None }) };
        tier.check_login(spec, access)?;
        Ok(Arc::new(tier))
    }

    /// A Redis that answers but refuses the login (or a TLS server whose certificate the
    /// CA file does not vouch for) is a mistake in the model's settings: the load fails,
    /// naming where the credential came from. A Redis that does not answer at all is
    /// tolerated as always (the tier backs off and reconnects when it returns).
    fn check_login(&self, spec: &str, access: &Access) -> Result<()> {
        if access.credential.is_none() && access.ca_file.is_none() {
            return Ok(());
        }
        let e = match self.connect_raw() {
            Ok(conn) => {
                self.state.lock().conn = Some(conn);
                return Ok(());
            }
            Err(e) => e,
        };
        let login = access
            .credential
            .as_ref()
            .map(|c| format!("user '{}' with the password from {}", c.user, c.source))
            .unwrap_or_else(|| "no login".into());
        let refused = matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
            || e.code().is_some_and(|c| c == "WRONGPASS" || c == "NOAUTH" || c == "NOPERM");
        let text = e.to_string();
        let certificate = text.contains("certificate") || text.contains("Certificate");
        if refused || certificate {
            return Err(Error::invalid_arg(format!(
                "volatile_db '{spec}': {} ({login}{}): {text}",
                if refused {
                    "Redis refused the login"
                } else {
                    "the TLS server's certificate was not accepted"
                },
                access
                    .ca_file
                    .as_ref()
                    .map(|(p, _)| format!(", CA file '{p}'"))
                    .unwrap_or_default()
            )));
        }
        log::warn!("volatile_db '{spec}': not reachable at load ({text}); the tier retries on use");
        Ok(())
    }

    fn connect(&self) -> Result<Conn> {
        self.connect_raw().map_err(redis_err)
    }

    fn connect_raw(&self) -> redis::RedisResult<Conn> {
        Ok(match &self.target {
            Target::Single(c) => {
                let conn = c.get_connection_with_timeout(TIMEOUT)?;
                conn.set_read_timeout(Some(TIMEOUT))?;
                conn.set_write_timeout(Some(TIMEOUT))?;
                Conn::Single(conn)
            }
            Target::Cluster(c) => Conn::Cluster(Box::new(c.get_connection()?)),
        })
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
