//! A slow and partitioned network between the demo instances and PostgreSQL: TCP proxies on
//! loopback, one per instance and server, that the instances connect through. A proxy
//! forwards bytes both ways and, on command, adds latency to every chunk it forwards,
//! stalls (stops forwarding, connections kept open, new ones accepted but silent) and cuts
//! every connection it carries with a reset, mid-query or mid-transaction.
//!
//! Faults land on one instance's links (a partition of that instance from the database,
//! the others carrying on and taking its leases over) or on every instance's at once. In the
//! `pgbouncer` topology the instances' links lead to PgBouncer, and one more proxy, a
//! [`SharedLink`] carrying every instance's traffic, leads from PgBouncer to PostgreSQL:
//! faults on every link hit it too.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One proxy: a loopback port forwarding to `upstream`.
#[derive(Debug)]
struct Proxy {
    port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct State {
    upstream: SocketAddr,
    /// Added before every chunk is forwarded, in either direction.
    latency_ms: AtomicU64,
    /// While `true`, nothing is forwarded.
    stalled: watch::Sender<bool>,
    /// Bumped to cut every open connection.
    cuts: watch::Sender<u64>,
    /// Connections open now.
    open: AtomicU64,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(State {
            upstream,
            latency_ms: AtomicU64::new(0),
            stalled: watch::Sender::new(false),
            cuts: watch::Sender::new(0),
            open: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept(listener, state.clone()));
        Ok(Self { port, state, task })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        // Connections still open end with the cut.
        self.state.cuts.send_modify(|n| *n += 1);
    }
}

async fn accept(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        tokio::spawn(carry(client, state.clone()));
    }
}

/// Carries one connection until either side closes it or a cut.
async fn carry(mut client: TcpStream, state: Arc<State>) {
    let mut cuts = state.cuts.subscribe();
    cuts.borrow_and_update();
    let Ok(mut server) = TcpStream::connect(state.upstream).await else {
        // As a refused connection looks to the client: closed at once.
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    state.open.fetch_add(1, Ordering::Relaxed);
    let cut = {
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        tokio::select! {
            _ = pump(&mut client_read, &mut server_write, &state) => false,
            _ = pump(&mut server_read, &mut client_write, &state) => false,
            _ = cuts.changed() => true,
        }
    };
    state.open.fetch_sub(1, Ordering::Relaxed);
    if cut {
        // A reset, not a clean close: what a dead link or a flushed NAT table looks like.
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
}

/// Forwards `from` to `to` chunk by chunk, with the proxy's latency and stalls.
async fn pump<R, W>(from: &mut R, to: &mut W, state: &State) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut stalled = state.stalled.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let latency = state.latency_ms.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        // Held while stalled; a closed sender (the proxy dropped) ends the wait.
        let _ = stalled.wait_for(|stalled| !*stalled).await;
        to.write_all(&buf[..n]).await?;
    }
}

/// A proxy that carries every instance's traffic: between PgBouncer and PostgreSQL.
/// Started before what connects through it, then handed to [`Network::with_shared`].
#[derive(Debug)]
pub struct SharedLink(Proxy);

impl SharedLink {
    /// A proxy on a free loopback port to `upstream_port` on loopback.
    pub async fn start(upstream_port: u16) -> Result<Self, String> {
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream_port));
        Proxy::start(upstream)
            .await
            .map(Self)
            .map_err(|e| format!("proxy: {e}"))
    }

    /// The port to connect to instead of the upstream's.
    pub fn port(&self) -> u16 {
        self.0.port
    }
}

/// The proxies of a soak: `links[instance][server]`, and the shared link if there is one.
#[derive(Debug)]
pub struct Network {
    links: Vec<Vec<Proxy>>,
    shared: Option<Proxy>,
}

impl Network {
    /// Proxies for `instances` instances to each of the servers on `ports` (loopback).
    pub async fn start(instances: usize, ports: &[u16]) -> Result<Self, String> {
        let mut links = Vec::with_capacity(instances);
        for _ in 0..instances {
            let mut link = Vec::with_capacity(ports.len());
            for port in ports {
                let upstream = SocketAddr::from(([127, 0, 0, 1], *port));
                link.push(
                    Proxy::start(upstream)
                        .await
                        .map_err(|e| format!("proxy: {e}"))?,
                );
            }
            links.push(link);
        }
        Ok(Self {
            links,
            shared: None,
        })
    }

    /// The network with `link` as its shared link: faults on every instance's links
    /// (`None`) hit it too, faults on one instance's links leave it alone.
    pub fn with_shared(self, link: SharedLink) -> Self {
        Self {
            shared: Some(link.0),
            ..self
        }
    }

    /// The proxies' ports for `instance`, in the servers' order.
    pub fn ports(&self, instance: usize) -> Vec<u16> {
        self.links[instance]
            .iter()
            .map(|proxy| proxy.port)
            .collect()
    }

    /// Number of instances the network links.
    pub fn instances(&self) -> usize {
        self.links.len()
    }

    fn proxies(&self, instance: Option<usize>) -> impl Iterator<Item = &Proxy> {
        let shared = self.shared.iter().filter(move |_| instance.is_none());
        self.links
            .iter()
            .enumerate()
            .filter(move |(i, _)| instance.is_none_or(|only| only == *i))
            .flat_map(|(_, link)| link.iter())
            .chain(shared)
    }

    /// Adds `latency` to every forwarded chunk on the links of `instance` (all: `None`).
    pub fn set_latency(&self, instance: Option<usize>, latency: Duration) {
        for proxy in self.proxies(instance) {
            let ms = latency.as_millis() as u64;
            proxy.state.latency_ms.store(ms, Ordering::Relaxed);
        }
    }

    /// Stops (or resumes) forwarding on the links of `instance` (all: `None`).
    pub fn set_stalled(&self, instance: Option<usize>, stalled: bool) {
        for proxy in self.proxies(instance) {
            proxy.state.stalled.send_replace(stalled);
        }
    }

    /// Resets every connection on the links of `instance` (all: `None`); returns how many
    /// were open.
    pub fn cut(&self, instance: Option<usize>) -> u64 {
        let mut open = 0;
        for proxy in self.proxies(instance) {
            open += proxy.state.open.load(Ordering::Relaxed);
            proxy.state.cuts.send_modify(|n| *n += 1);
        }
        open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback; returns its address.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, text: &[u8]) -> io::Result<Vec<u8>> {
        stream.write_all(text).await?;
        let mut back = vec![0u8; text.len()];
        stream.read_exact(&mut back).await?;
        Ok(back)
    }

    #[tokio::test]
    async fn forwards_delays_stalls_and_cuts() {
        let upstream = echo().await;
        let network = Network::start(2, &[upstream.port()]).await.unwrap();
        let port = network.ports(0)[0];
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        assert_eq!(round_trip(&mut stream, b"ping").await.unwrap(), b"ping");

        // Latency: each direction waits before forwarding.
        network.set_latency(Some(0), Duration::from_millis(100));
        let started = std::time::Instant::now();
        assert_eq!(round_trip(&mut stream, b"slow").await.unwrap(), b"slow");
        assert!(started.elapsed() >= Duration::from_millis(200));
        network.set_latency(None, Duration::ZERO);

        // A stall holds the bytes until it ends; the connection survives it.
        network.set_stalled(Some(0), true);
        stream.write_all(b"held").await.unwrap();
        let mut back = [0u8; 4];
        let early = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut back));
        assert!(early.await.is_err(), "nothing may pass a stalled link");
        network.set_stalled(Some(0), false);
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"held");

        // A cut on the other instance's links leaves this one alone.
        assert_eq!(network.cut(Some(1)), 0);
        assert_eq!(round_trip(&mut stream, b"same").await.unwrap(), b"same");

        // A cut resets the connection.
        assert_eq!(network.cut(Some(0)), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(round_trip(&mut stream, b"gone").await.is_err());
        let mut fresh = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        assert_eq!(round_trip(&mut fresh, b"new").await.unwrap(), b"new");
    }

    #[tokio::test]
    async fn the_shared_link_takes_the_faults_on_every_link_only() {
        let upstream = echo().await;
        let shared = SharedLink::start(upstream.port()).await.unwrap();
        let shared_port = shared.port();
        // The instances' links lead to the shared link, as to PgBouncer in front of it.
        let network = Network::start(2, &[shared_port])
            .await
            .unwrap()
            .with_shared(shared);
        let mut through = TcpStream::connect(("127.0.0.1", network.ports(0)[0]))
            .await
            .unwrap();
        assert_eq!(round_trip(&mut through, b"ping").await.unwrap(), b"ping");
        let mut direct = TcpStream::connect(("127.0.0.1", shared_port))
            .await
            .unwrap();
        assert_eq!(round_trip(&mut direct, b"ping").await.unwrap(), b"ping");

        // One instance's faults leave the shared link alone.
        network.set_stalled(Some(1), true);
        assert_eq!(round_trip(&mut direct, b"free").await.unwrap(), b"free");
        network.set_stalled(Some(1), false);
        assert_eq!(network.cut(Some(1)), 0);
        assert_eq!(round_trip(&mut direct, b"kept").await.unwrap(), b"kept");

        // Faults on every link hit it: a stall holds it, a cut resets its connections
        // (the direct one, and the one carrying instance 0's), and the instance's own.
        network.set_stalled(None, true);
        direct.write_all(b"held").await.unwrap();
        let mut back = [0u8; 4];
        let early = tokio::time::timeout(Duration::from_millis(300), direct.read(&mut back));
        assert!(
            early.await.is_err(),
            "nothing may pass a stalled shared link"
        );
        network.set_stalled(None, false);
        direct.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"held");
        assert_eq!(network.cut(None), 3);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(round_trip(&mut direct, b"gone").await.is_err());
        assert!(round_trip(&mut through, b"gone").await.is_err());
    }
}
