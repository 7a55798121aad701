//! Where a run's live events go: the [`EventSink`] the driver reports every step to, and that
//! tools (through [`ToolContext::events`](crate::tool::ToolContext::events)) and embedders
//! report progress to. A leaf: it knows nothing of the engine, the driver or the tools.

use agentry_types::RunEvent;
use tokio::sync::mpsc;

/// Where a run's events go. Sending waits when the receiver is slow (back-pressure); a receiver
/// that went away is ignored, and the run goes on.
///
/// Events travel boxed: a channel's buffer (and every future waiting to send) then holds a
/// pointer, not a `RunEvent` (a few hundred bytes). A live run keeps its channel for as long as
/// it goes, so this is most of the channel's memory when a thousand runs stream at once.
#[derive(Debug, Clone)]
pub struct EventSink(mpsc::Sender<Box<RunEvent>>);

/// The receiving end of an [`EventSink`].
pub type EventReceiver = mpsc::Receiver<Box<RunEvent>>;

impl EventSink {
    /// A sink and its receiving end, holding up to `capacity` undelivered events.
    pub fn channel(capacity: usize) -> (Self, EventReceiver) {
        let (sender, receiver) = mpsc::channel(capacity.max(1));
        (Self(sender), receiver)
    }

    // Not an `async fn`: the event is boxed before the future is made, so the future holds
    // the box, not the event.
    pub(crate) fn send(&self, event: RunEvent) -> impl Future<Output = ()> + Send + '_ {
        let event = Box::new(event);
        async move {
            // A closed receiver means nobody is watching; the run itself is unaffected.
            let _ = self.0.send(event).await;
        }
    }

    /// Reports a live event of the run from outside the engine (a tool's progress, an MCP
    /// server's request for input). Nobody watching is not an error.
    pub fn emit(&self, event: RunEvent) -> impl Future<Output = ()> + Send + '_ {
        self.send(event)
    }
}
