//! Where a run's live events go: the [`EventSink`] the driver reports every step to, and that
//! tools (through [`ToolContext::events`](crate::tool::ToolContext::events)) and embedders
//! report progress to. A leaf: it knows nothing of the engine, the driver or the tools.

use agentry_types::RunEvent;
use tokio::sync::mpsc;

/// Where a run's events go. Sending waits when the receiver is slow (back-pressure); a receiver
/// that went away is ignored, and the run goes on.
#[derive(Debug, Clone)]
pub struct EventSink(mpsc::Sender<RunEvent>);

impl EventSink {
    /// A sink and its receiving end, holding up to `capacity` undelivered events.
    pub fn channel(capacity: usize) -> (Self, mpsc::Receiver<RunEvent>) {
        let (sender, receiver) = mpsc::channel(capacity.max(1));
        (Self(sender), receiver)
    }

    pub(crate) async fn send(&self, event: RunEvent) {
        // A closed receiver means nobody is watching; the run itself is unaffected.
        let _ = self.0.send(event).await;
    }

    /// Reports a live event of the run from outside the engine (a tool's progress, an MCP
    /// server's request for input). Nobody watching is not an error.
    pub async fn emit(&self, event: RunEvent) {
        self.send(event).await;
    }
}
