//! What every request handler shares: the application, and what only HTTP needs (logins and
//! keys, metrics, the Host/Origin policy).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use agentry_app::auth::Authenticator;
use agentry_app::domain::store::Store;
use agentry_app::{App, ToolEnvironment};

use crate::error::ApiError;
use crate::metrics::Metrics;

/// The server's shared state: the [`App`] (`state.app`, named where a handler calls it) and the
/// HTTP layer's own parts. Cheap to clone (every request clones it, often more than once): one shared
/// [`ServerParts`]. Changing a part (`DerefMut`) is for setting up, before the state is shared.
#[derive(Clone)]
pub struct AppState(Arc<ServerParts>);

impl Deref for AppState {
    type Target = ServerParts;

    fn deref(&self) -> &ServerParts {
        &self.0
    }
}

impl DerefMut for AppState {
    fn deref_mut(&mut self) -> &mut ServerParts {
        Arc::make_mut(&mut self.0)
    }
}

/// What [`AppState`] shares.
#[derive(Clone)]
pub struct ServerParts {
    /// The application every handler submits to.
    pub app: App,
    /// API keys and logins.
    pub auth: Authenticator,
    /// Prometheus metrics (also the hub's run observer).
    pub metrics: Arc<Metrics>,
    /// Which `Host` names and browser origins may reach the API (the origins are also the
    /// CORS origins; none: CORS off).
    pub access: crate::access::AccessPolicy,
}

impl AppState {
    /// State over `store`, with the runtime built from its configuration.
    pub async fn new(store: Store) -> Result<Self, ApiError> {
        Box::pin(Self::with_tools(store, ToolEnvironment::default())).await
    }

    /// State over `store` whose runs work in `tools`' workspaces and sandboxes.
    pub async fn with_tools(store: Store, tools: ToolEnvironment) -> Result<Self, ApiError> {
        let metrics = Arc::new(Metrics::default());
        let app = Box::pin(App::observed(store.clone(), tools, metrics.clone())).await?;
        Ok(Self(Arc::new(ServerParts {
            app,
            auth: Authenticator::new(store),
            metrics,
            access: crate::access::AccessPolicy::default(),
        })))
    }
}
