//! Running the server: binding, start-up recovery, graceful shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::routes::router;
use crate::state::AppState;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The address to listen on.
    pub addr: SocketAddr,
    /// How long shutdown waits for live runs to finish before leaving them to start-up recovery.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 7988)),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Binding beyond loopback needs authentication, which is not configured.
    #[error(
        "refusing to listen on {0} without authentication: create an API key first \
         (`agentry keys create`), or listen on 127.0.0.1"
    )]
    InsecureBind(SocketAddr),
    /// The store failed while checking the configuration.
    #[error("cannot read the configuration: {0}")]
    Config(String),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The node cannot join the cluster (another live node has its id).
    #[error("cannot join the cluster: {0}")]
    Cluster(String),
    /// Serving failed.
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Binds `config.addr`. Anything but loopback needs authentication (an active API key in
/// `store`).
pub async fn bind(
    config: &ServerConfig,
    store: &agentry_app::domain::store::Store,
) -> Result<TcpListener, ServeError> {
    if !config.addr.ip().is_loopback() {
        let secured = agentry_app::auth::any_active_key(store)
            .await
            .map_err(|error| ServeError::Config(error.to_string()))?;
        if !secured {
            return Err(ServeError::InsecureBind(config.addr));
        }
    }
    listen(config.addr).map_err(|source| ServeError::Bind {
        addr: config.addr,
        source,
    })
}

/// How many connections may wait to be accepted. A burst beyond the queue is not refused but
/// dropped, and each dropped client tries again only after a second (TCP's first
/// retransmission): with tokio's 1,024, a thousand clients starting at once lost a second at
/// the tail. The kernel caps it at `net.core.somaxconn` (4,096 on current Linux).
pub const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` (address reuse on, as `TcpListener::bind` does) with an accept queue of
/// [`LISTEN_BACKLOG`].
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// `listener` with Nagle's algorithm off on every connection it accepts: a stream's small
/// writes (SSE deltas, terminal output) leave at once instead of waiting up to a delayed ACK
/// (about 40 ms) behind the previous one.
pub fn without_delay(
    listener: TcpListener,
) -> axum::serve::TapIo<TcpListener, fn(&mut tokio::net::TcpStream)> {
    use axum::serve::ListenerExt as _;
    fn no_delay(stream: &mut tokio::net::TcpStream) {
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY not set: {error}");
        }
    }
    listener.tap_io(no_delay as fn(&mut tokio::net::TcpStream))
}

/// Serves until `state.shutdown` is cancelled. Runs that were in flight when the process last
/// stopped are resumed first. On shutdown the server stops accepting connections and gives live
/// runs `shutdown_grace` to finish; runs still going then stay in flight in the log and resume
/// at the next start.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    config: &ServerConfig,
) -> Result<(), ServeError> {
    // A node of the cluster first (refused while another live process has its id): the runs it
    // resumes and claims carry its leases.
    Box::pin(state.app.join_cluster())
        .await
        .map_err(|error| ServeError::Cluster(error.message))?;
    state.app.recover_at_start().await;
    let workflows = state.app.workflows().resume().await;
    if workflows > 0 {
        tracing::info!(workflows, "resumed unfinished workflow runs");
    }
    // Schedules an earlier release stored as their client's request alone get its spec, read
    // by the front-end that owns that request's format, before anything fires.
    match Box::pin(
        state
            .app
            .schedules()
            .upgrade(crate::routes::schedules::stored_run_spec),
    )
    .await
    {
        Ok(0) => {}
        Ok(schedules) => tracing::info!(schedules, "rewrote schedules an earlier release stored"),
        Err(error) => tracing::warn!("cannot rewrite stored schedules: {}", error.message),
    }
    // The background-run worker: claims queued runs (and runs whose worker died) from now on.
    state.app.start_worker();
    let shutdown = state.app.shutdown_signal().clone();
    let app_state = state.app.clone();
    let app = router(state);
    // One router for every connection: the make-service hands each a cheap clone, where
    // serving the `Router` itself would rebuild every route's service stack per connection.
    // Each request knows its peer's address (the login throttle counts per client).
    axum::serve(
        without_delay(listener),
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move { shutdown.cancelled().await })
    .await?;
    let runs = app_state.drain(config.shutdown_grace).await;
    if runs > 0 {
        tracing::warn!(
            runs,
            "stopping with runs in flight; background runs go to another node now, the others \
             resume at the next start"
        );
    }
    // Leaving lets this node's background runs go at once: another node claims them now; the
    // MCP servers' processes and every sandbox end with us.
    Box::pin(app_state.release()).await;
    Ok(())
}
