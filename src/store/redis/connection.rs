//! Which Redis deployment the Redis store talks to, named by its URL, and one connection type for
//! both kinds: a single server (`redis://…`, optionally a primary with replicas behind one
//! address) or a Redis Cluster (`redis+cluster://host1:port,host2:port,…`, the same for Valkey).
//!
//! Commands and scripts are sent the same way to either; the cluster connection routes each by
//! its first key, which is why every script declares all of its keys and one conversation's keys
//! share a hash tag (see [`super::layout`]).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};

use super::super::StoreError;

/// URL scheme of a Redis Cluster: the seed nodes, comma-separated, share one userinfo.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";
const CLUSTER_TLS_SCHEME: &str = "rediss+cluster://";

/// Whether `spec` names a Redis store (single server or cluster).
pub fn is_redis_url(spec: &str) -> bool {
    ["redis://", "rediss://", CLUSTER_SCHEME, CLUSTER_TLS_SCHEME]
        .iter()
        .any(|scheme| spec.starts_with(scheme))
}

/// A parsed Redis URL: where to connect, not yet connected.
#[derive(Clone)]
pub enum Target {
    Single(Client, Timeouts),
    Cluster(ClusterClient),
}

/// How long connecting and each call may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

impl Target {
    /// Parses a store URL. Errors name the problem's category only: a URL may hold a password.
    pub fn parse(url: &str, timeouts: Timeouts) -> Result<Target, StoreError> {
        if url.starts_with("rediss://") || url.starts_with(CLUSTER_TLS_SCHEME) {
            return Err(StoreError::Unavailable(
                "rediss:// (TLS) is not supported by this build; use redis:// or redis+cluster://"
                    .into(),
            ));
        }
        if let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) {
            return parse_cluster(rest, timeouts).map(Target::Cluster);
        }
        Client::open(url)
            .map(|client| Target::Single(client, timeouts))
            .map_err(invalid)
    }

    /// The server's or the seed nodes' addresses, for logs (never a password).
    pub fn address(&self) -> String {
        match self {
            Target::Single(client, _) => client.get_connection_info().addr.to_string(),
            Target::Cluster(_) => "redis cluster".into(),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(_))
    }

    /// Opens a connection that reconnects by itself where the client supports it.
    pub async fn connect(&self) -> redis::RedisResult<Connection> {
        match self {
            Target::Single(client, timeouts) => {
                let config = ConnectionManagerConfig::new()
                    // One attempt per (re)connect, no backoff: the manager's backoff starts at a
                    // full second and grows, which would hold a returning Redis off for minutes.
                    // Instead the store's probe triggers a fresh attempt on each tick.
                    .set_number_of_retries(0)
                    .set_connection_timeout(timeouts.connect)
                    .set_response_timeout(timeouts.response);
                ConnectionManager::new_with_config(client.clone(), config)
                    .await
                    .map(|manager| Connection::Single(Box::new(manager)))
            }
            Target::Cluster(client) => client.get_async_connection().await.map(Connection::Cluster),
        }
    }
}

/// `host1:port,host2:port/` after the scheme, optionally `user:password@` first.
fn parse_cluster(rest: &str, timeouts: Timeouts) -> Result<ClusterClient, StoreError> {
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, rest),
    };
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    if hosts.is_empty() || hosts.contains('/') {
        return Err(StoreError::Unavailable(
            "invalid redis+cluster URL: expected redis+cluster://[user:password@]host:port,host:port,…"
                .into(),
        ));
    }
    let nodes = hosts
        .split(',')
        .map(|host| {
            let node = match userinfo {
                Some(userinfo) => format!("redis://{userinfo}@{host}/"),
                None => format!("redis://{host}/"),
            };
            node.into_connection_info().map_err(invalid)
        })
        .collect::<Result<Vec<_>, _>>()?;
    ClusterClientBuilder::new(nodes)
        // A redirect (MOVED/ASK after the cluster reshards) is a retry: allow a couple, with short
        // waits, so that calls still fit the store's call timeout.
        .retries(2)
        .min_retry_wait(10)
        .max_retry_wait(100)
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.response)
        .build()
        .map_err(invalid)
}

fn invalid(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(format!("invalid redis URL ({:?})", e.kind()))
}

/// A live connection to either kind of deployment; cheap to clone (clones share it).
#[derive(Clone)]
pub enum Connection {
    /// Boxed: the manager is much larger than the cluster handle.
    Single(Box<ConnectionManager>),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        connect: Duration::from_millis(500),
        response: Duration::from_millis(250),
    };

    #[test]
    fn cluster_urls_name_every_seed_node() {
        let Target::Cluster(_) =
            Target::parse("redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001/", T).unwrap()
        else {
            panic!("not a cluster")
        };
        assert!(Target::parse("redis+cluster://node-a:7000,node-b:7000", T)
            .unwrap()
            .is_cluster());
        assert!(!Target::parse("redis://127.0.0.1:6379/", T)
            .unwrap()
            .is_cluster());
    }

    #[test]
    fn bad_cluster_urls_are_refused_without_echoing_them() {
        for url in [
            "redis+cluster://",
            "redis+cluster://user:secret@/",
            "redis+cluster://user:secret@h1:1/db/2",
            "redis+cluster://user:secret@h1:notaport,h2:2",
            "rediss+cluster://user:secret@h1:1",
        ] {
            let Err(e) = Target::parse(url, T) else {
                panic!("accepted {url}")
            };
            assert!(!e.to_string().contains("secret"), "{e}");
        }
        assert!(is_redis_url("redis+cluster://h:1"));
        assert!(!is_redis_url("/var/lib/compactor.db"));
    }
}
