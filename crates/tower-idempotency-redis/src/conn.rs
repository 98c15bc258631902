//! The connection to Redis — one [`ConnectionManager`] (standalone) or one
//! [`ClusterConnection`] (cluster), cloned per call — the script calls, `WAIT` on the key's
//! primary, commands on every primary, and the settings read at connect.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, FromRedisValue, RedisResult, Script, Value};

use crate::config::{NodeSettings, RedisStoreConfig, ServerSettings, Topology};
use crate::error::RedisStoreError;

/// The store's one connection.
#[derive(Clone)]
pub(crate) enum Conn {
    Standalone {
        manager: ConnectionManager,
        url: String,
    },
    Cluster(ClusterConnection),
}

/// How long a command may take beyond `WAIT`'s own timeout before it counts as failed.
const RESPONSE_MARGIN: Duration = Duration::from_secs(3);
/// How long connecting to a node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Conn {
    pub(crate) async fn connect(config: &RedisStoreConfig) -> Result<Self, RedisStoreError> {
        let response_timeout = config.wait_timeout + RESPONSE_MARGIN;
        match &config.topology {
            Topology::Standalone(url) => {
                let client = redis::Client::open(url.as_str())?;
                let manager = ConnectionManager::new_with_config(
                    client,
                    ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(CONNECT_TIMEOUT))
                        .set_response_timeout(Some(response_timeout)),
                )
                .await?;
                Ok(Self::Standalone {
                    manager,
                    url: url.clone(),
                })
            }
            Topology::Cluster(seeds) => {
                if seeds.is_empty() {
                    return Err(RedisStoreError::Config(
                        "a cluster needs at least one seed URL".into(),
                    ));
                }
                let client = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(response_timeout)
                    .build()?;
                Ok(Self::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// Runs `script` with `keys` and `args` (routed by its first key in a cluster): one
    /// `EVALSHA` whose arguments are copied once, into the command; after a `NOSCRIPT` (a
    /// restarted or failed-over node) the script is loaded on that node and run again.
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> RedisResult<T> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        for arg in args {
            cmd.arg(*arg);
        }
        match self.query(&cmd).await {
            Err(error)
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                // As `redis::Script` does: `SCRIPT LOAD` (in a cluster, on every primary).
                match self.clone() {
                    Self::Standalone { mut manager, .. } => script.load_async(&mut manager).await?,
                    Self::Cluster(mut cluster) => script.load_async(&mut cluster).await?,
                };
                self.query(&cmd).await
            }
            answer => answer,
        }
    }

    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self.clone() {
            Self::Standalone { mut manager, .. } => cmd.query_async(&mut manager).await,
            Self::Cluster(mut cluster) => cmd.query_async(&mut cluster).await,
        }
    }

    /// `WAIT replicas timeout` on the connection to `key`'s primary (in a cluster, routed to
    /// the slot's primary only, never to every primary): how many replicas acknowledged
    /// every write this connection made so far.
    pub(crate) async fn wait(
        &self,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<u32> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(
            u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        let value = match self.clone() {
            Self::Standalone { mut manager, .. } => manager.req_packed_command(&cmd).await?,
            Self::Cluster(mut cluster) => {
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                cluster
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?
            }
        };
        Ok(u32::from_redis_value(value)?)
    }

    /// Runs `cmd` on every primary: `(address, answer)` each.
    pub(crate) async fn on_primaries(&self, cmd: Cmd) -> RedisResult<Vec<(String, Value)>> {
        match self.clone() {
            Self::Standalone { mut manager, url } => {
                let value = manager.req_packed_command(&cmd).await?;
                Ok(vec![(url, value)])
            }
            Self::Cluster(mut cluster) => {
                let value = cluster
                    .route_command(
                        cmd,
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await?;
                match value {
                    Value::Map(pairs) => pairs
                        .into_iter()
                        .map(|(address, value)| Ok((String::from_redis_value(address)?, value)))
                        .collect(),
                    other => Ok(vec![(String::new(), other)]),
                }
            }
        }
    }

    /// Runs `cmd` on the node at `address` (`host:port`; ignored on a standalone server).
    pub(crate) async fn on_node(&self, address: &str, cmd: Cmd) -> RedisResult<Value> {
        match self.clone() {
            Self::Standalone { mut manager, .. } => manager.req_packed_command(&cmd).await,
            Self::Cluster(mut cluster) => {
                let (host, port) = address.rsplit_once(':').ok_or_else(|| {
                    redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "a cluster node address without a port",
                        address.to_owned(),
                    ))
                })?;
                let port = port.parse().map_err(|_| {
                    redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "a cluster node address with a bad port",
                        address.to_owned(),
                    ))
                })?;
                cluster
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.to_owned(),
                            port,
                        }),
                    )
                    .await
            }
        }
    }

    /// Every key matching `pattern` of `kind` (`SCAN … TYPE kind`), on every primary: a walk
    /// of the whole keyspace, for the operator's tools and the purge.
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        kind: &str,
        limit: usize,
    ) -> RedisResult<Vec<String>> {
        let mut found = Vec::new();
        let primaries = self.on_primaries(redis::cmd("PING")).await?;
        for (address, _) in primaries {
            let mut cursor = 0u64;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .arg("TYPE")
                    .arg(kind);
                let (next, keys): (u64, Vec<String>) =
                    FromRedisValue::from_redis_value(self.on_node(&address, cmd).await?)?;
                found.extend(keys);
                if next == 0 || found.len() >= limit {
                    break;
                }
                cursor = next;
            }
            if found.len() >= limit {
                break;
            }
        }
        Ok(found)
    }

    /// Reads `maxmemory-policy`, `appendonly`, `appendfsync` and the connected replicas of
    /// every primary.
    pub(crate) async fn settings(&self) -> Result<ServerSettings, RedisStoreError> {
        let mut config = redis::cmd("CONFIG");
        config
            .arg("GET")
            .arg("maxmemory-policy")
            .arg("appendonly")
            .arg("appendfsync");
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let infos = self.on_primaries(info).await?;
        let configs = match self.on_primaries(config).await {
            Ok(configs) => configs,
            // A managed Redis that refuses (or renamed) CONFIG: the settings cannot be read,
            // and `connect` refuses them as an unknown eviction policy unless overridden.
            Err(error) if error.kind() != redis::ErrorKind::Io && !error.is_timeout() => {
                tracing::warn!(error = %error, "cannot read the Redis servers' settings (CONFIG GET)");
                infos
                    .iter()
                    .map(|(address, _)| (address.clone(), redis::Value::Nil))
                    .collect()
            }
            Err(error) => return Err(error.into()),
        };
        let mut nodes = Vec::new();
        for (address, value) in configs {
            let pairs: std::collections::HashMap<String, String> = match value {
                Value::Nil | Value::ServerError(_) => [
                    ("maxmemory-policy", UNREADABLE),
                    ("appendonly", UNREADABLE),
                    ("appendfsync", UNREADABLE),
                ]
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value.to_owned()))
                .collect(),
                value => {
                    FromRedisValue::from_redis_value(value).map_err(redis::RedisError::from)?
                }
            };
            let replicas = infos
                .iter()
                .find(|(at, _)| *at == address)
                .and_then(|(_, value)| String::from_redis_value(value.clone()).ok())
                .map_or(0, |text| connected_replicas(&text));
            let get = |name: &str| pairs.get(name).cloned().unwrap_or_default();
            nodes.push(NodeSettings {
                address,
                maxmemory_policy: get("maxmemory-policy"),
                appendonly: get("appendonly"),
                appendfsync: get("appendfsync"),
                replicas,
            });
        }
        nodes.sort_by(|a, b| a.address.cmp(&b.address));
        let first = nodes.first().cloned().unwrap_or_default();
        let evicting = nodes
            .iter()
            .find(|node| node.maxmemory_policy != "noeviction");
        Ok(ServerSettings {
            maxmemory_policy: evicting.map_or(first.maxmemory_policy.clone(), |node| {
                node.maxmemory_policy.clone()
            }),
            appendonly: first.appendonly,
            appendfsync: first.appendfsync,
            replicas: nodes.iter().map(|node| node.replicas).min().unwrap_or(0),
            nodes,
        })
    }
}

/// What [`ServerSettings`] says of a setting `CONFIG GET` could not read.
pub(crate) const UNREADABLE: &str = "unreadable (CONFIG GET refused)";

/// `connected_slaves:N` of `INFO replication`.
fn connected_replicas(info: &str) -> u32 {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}
