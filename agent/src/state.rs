//! The state every connection shares, built once at start from the lower modules: the
//! configuration, the workspace handle, the chats, the memory, the tool registry and the brain.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::brain::{self, Brain};
use crate::chat::Chats;
use crate::config::Config;
use crate::confine::Workspace;
use crate::db::{Database, DbError};
use crate::lease::Leases;
use crate::memory::{Memory, MemoryError};
use crate::perceive::Perception;
use crate::store::{Backend, Store, StoreError};
use crate::tools::{Hub, Registry};

/// Shared state of the server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The configuration.
    pub config: Arc<Config>,
    /// The workspace root handle.
    pub workspace: Workspace,
    /// Chats and their records.
    pub chats: Arc<Chats>,
    /// The tools.
    pub registry: Arc<Registry>,
    /// The memory tools' durable facts, per user and per room.
    pub memory: Memory,
    /// Chats' leases: one turn at a time per chat across agents sharing a database.
    pub leases: Leases,
    /// The database, when the state is kept there.
    pub db: Option<Database>,
    /// The brain.
    pub brain: Arc<dyn Brain>,
    /// Pictures for the model, transcription.
    pub perception: Perception,
    /// Fires on shutdown.
    pub shutdown: CancellationToken,
    /// Tracks connection and turn tasks, so shutdown can wait for them.
    pub tracker: TaskTracker,
    /// Renders `/metrics`; every agent in a process shares one recorder (`None` when another
    /// library installed the process's recorder first).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

/// The workspace or the state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The workspace root cannot be opened.
    #[error("WORKSPACE_ROOT: cannot open {path}: {source}")]
    Workspace {
        /// The configured root.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The state directory cannot be used.
    #[error("AGENT_STATE_DIR: {0}")]
    Store(#[from] StoreError),
    /// The memory folder in the state directory cannot be used.
    #[error("AGENT_STATE_DIR: {0}")]
    Memory(#[from] MemoryError),
    /// The database cannot be used.
    #[error("AGENT_DATABASE_URL: {0}")]
    Database(#[from] DbError),
}

impl AppState {
    /// Opens the workspace and the state (the database, or the state directory), and builds
    /// the brain and the tools.
    pub async fn new(
        config: Config,
        shutdown: CancellationToken,
        tracker: TaskTracker,
    ) -> Result<Self, StateError> {
        let workspace = Workspace::open(&config.workspace_root, config.limits.max_file_size)
            .map_err(|source| StateError::Workspace {
                path: config.workspace_root.display().to_string(),
                source,
            })?;
        let (store, memory, db) = match &config.database {
            Some(db) => {
                let db = Database::open_waiting(db).await?;
                (
                    Backend::postgres(db.clone()),
                    Memory::postgres(db.clone()),
                    Some(db),
                )
            }
            None => (
                Backend::Files(Store::open(&config.state_dir)?),
                Memory::open(&config.state_dir)?,
                None,
            ),
        };
        let mut registry =
            Registry::new(config.tool_policy.clone()).offering_demos(config.offer_demo_tools);
        if !config.mcp.servers.is_empty() {
            // Servers start in the background, now: a slow or broken one never delays the
            // agent's start, and the first turns find the others ready.
            let hub = Arc::new(Hub::new(&config.mcp));
            hub.start_all();
            registry = registry.with_mcp(hub);
        }
        let registry = Arc::new(registry);
        let brain = brain::from_config(&config, db.as_ref());
        let perception = Perception::new(&config);
        Ok(Self {
            config: Arc::new(config),
            workspace,
            chats: Arc::new(Chats::new(store)),
            registry,
            memory,
            leases: Leases::new(db.clone()),
            db,
            brain,
            perception,
            shutdown,
            tracker,
            metrics: crate::metrics::install(),
        })
    }
}
