//! Where a run's live events go: the [`EventSink`] the driver reports every step to, and that
//! tools (through [`ToolContext::events`](crate::tool::ToolContext::events)) and embedders
//! report progress to. A leaf: it knows nothing of the engine, the driver or the tools.
//!
//! Events go through a channel to whoever reads the run's stream, or, once the reader has set a
//! [tap](EventReceiver::tap), straight to it in the sending task: a reader that only fans events
//! out (the server's hub) then costs no task of its own to wake for every event.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use agentry_types::RunEvent;
use tokio::sync::mpsc;

/// Where a run's events go. Sending waits when the receiver is slow (back-pressure); a receiver
/// that went away is ignored, and the run goes on.
///
/// Events travel boxed: a channel's buffer (and every future waiting to send) then holds a
/// pointer, not a `RunEvent` (a few hundred bytes). A live run keeps its channel for as long as
/// it goes, so this is most of the channel's memory when a thousand runs stream at once.
#[derive(Clone)]
pub struct EventSink {
    sender: mpsc::Sender<Box<RunEvent>>,
    tap: Arc<TapSlot>,
    /// Where the run's last event waits, when it is held back (see [`EventSink::holding_end`]).
    end: Option<Arc<Mutex<Option<Box<RunEvent>>>>>,
}

/// A run's last event, held back by [`EventSink::holding_end`] until [`HeldEnd::release`].
pub(crate) struct HeldEnd {
    sink: EventSink,
    end: Arc<Mutex<Option<Box<RunEvent>>>>,
}

impl HeldEnd {
    /// Sends the held last event, if the run sent one.
    pub(crate) async fn release(self) {
        let end = self
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(end) = end {
            self.sink.send_box(end).await;
        }
    }
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink")
            .field("tapped", &self.tap.tap.get().is_some())
            .finish_non_exhaustive()
    }
}

/// What takes a tapped run's events, called in the task that sends each one.
pub(crate) type Tap = Box<dyn Fn(Box<RunEvent>) + Send + Sync>;

/// The tap a sink and its receiver share, once one is set.
#[derive(Default)]
struct TapSlot {
    tap: OnceLock<Tap>,
    /// Held by a send into the channel and by setting the tap, so that every event is either in
    /// the channel when the tap takes its backlog, or goes to the tap: none is left behind in
    /// the channel, none overtakes an earlier one.
    switching: Mutex<()>,
}

/// The receiving end of an [`EventSink`].
pub struct EventReceiver {
    events: mpsc::Receiver<Box<RunEvent>>,
    tap: Arc<TapSlot>,
}

impl EventSink {
    /// A sink and its receiving end, holding up to `capacity` undelivered events.
    pub fn channel(capacity: usize) -> (Self, EventReceiver) {
        let (sender, events) = mpsc::channel(capacity.max(1));
        let tap = Arc::new(TapSlot::default());
        (
            Self {
                sender,
                tap: Arc::clone(&tap),
                end: None,
            },
            EventReceiver { events, tap },
        )
    }

    // Not an `async fn`: the event is boxed before the future is made, so the future holds
    // the box, not the event.
    pub(crate) fn send(&self, event: RunEvent) -> impl Future<Output = ()> + Send + '_ {
        self.send_box(Box::new(event))
    }

    /// This sink holding back the run's last event (`RunFinished`, `RunFailed`,
    /// `RunSuspended`) until the returned [`HeldEnd`] releases it: the session manager lets a
    /// run's end out only once the session no longer counts it as running, so a client told
    /// the run ended can start the next one at once.
    pub(crate) fn holding_end(mut self) -> (Self, HeldEnd) {
        let end = Arc::new(Mutex::new(None));
        let plain = self.clone();
        self.end = Some(Arc::clone(&end));
        (self, HeldEnd { sink: plain, end })
    }

    #[allow(clippy::manual_async_fn)] // Not an `async fn`: see `send`.
    fn send_box(&self, event: Box<RunEvent>) -> impl Future<Output = ()> + Send + '_ {
        async move {
            if let Some(end) = &self.end
                && event.is_terminal()
            {
                *end.lock().unwrap_or_else(PoisonError::into_inner) = Some(event);
                return;
            }
            if let Some(tap) = self.tap.tap.get() {
                tap(event);
                return;
            }
            // A closed receiver means nobody is watching; the run itself is unaffected.
            let Ok(permit) = self.sender.reserve().await else {
                return;
            };
            let switching = self
                .tap
                .switching
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match self.tap.tap.get() {
                // Tapped while this send waited for room: the backlog is gone to the tap.
                Some(tap) => {
                    drop(switching);
                    drop(permit);
                    tap(event);
                }
                None => permit.send(event),
            }
        }
    }

    /// Reports a live event of the run from outside the engine (a tool's progress, an MCP
    /// server's request for input). Nobody watching is not an error.
    pub fn emit(&self, event: RunEvent) -> impl Future<Output = ()> + Send + '_ {
        self.send(event)
    }
}

impl EventReceiver {
    /// The next event sent through the channel; `None` once every sink is gone (or, after
    /// [`tap`](Self::tap), once every sink is gone: tapped events do not come here).
    pub(crate) async fn recv(&mut self) -> Option<Box<RunEvent>> {
        self.events.recv().await
    }

    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Box<RunEvent>>> {
        self.events.poll_recv(cx)
    }

    /// From now on every event goes to `tap`, called in the task that sends it, in the order
    /// sent; the events already waiting in the channel go to it first, here. Set once: a
    /// second tap is ignored (returns false).
    pub(crate) fn tap(&mut self, tap: Tap) -> bool {
        let _switching = self
            .tap
            .switching
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.tap.tap.get().is_some() {
            return false;
        }
        // No send can put an event in the channel while the lock is held, and each one put
        // there before is complete: the backlog is whole.
        while let Ok(event) = self.events.try_recv() {
            tap(event);
        }
        self.tap.tap.set(tap).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use agentry_types::RunEvent;

    use super::EventSink;

    fn delta(n: usize) -> RunEvent {
        RunEvent::TextDelta {
            text: n.to_string(),
        }
    }

    fn number(event: &RunEvent) -> usize {
        match event {
            RunEvent::TextDelta { text } => text.parse().unwrap(),
            other => panic!("not a numbered delta: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_tap_takes_the_backlog_then_each_event_as_it_is_sent() {
        let (sink, mut receiver) = EventSink::channel(8);
        for n in 0..3 {
            sink.send(delta(n)).await;
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tapped = Arc::clone(&seen);
        assert!(receiver.tap(Box::new(move |event| {
            tapped.lock().unwrap().push(number(&event));
        })));
        assert_eq!(*seen.lock().unwrap(), [0, 1, 2], "the backlog, in order");
        sink.send(delta(3)).await;
        // Handled in the sending task: done when the send is, no task of its own to wait for.
        assert_eq!(*seen.lock().unwrap(), [0, 1, 2, 3]);
        assert!(!receiver.tap(Box::new(|_| {})), "a second tap is refused");
        drop(sink);
        assert!(
            receiver.recv().await.is_none(),
            "nothing comes through the channel"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tap_set_while_a_full_channel_holds_senders_back_loses_and_reorders_nothing() {
        // A channel of 2 with senders waiting for room: whatever the interleaving, each sender's
        // events reach the tap once each, in the order it sent them.
        for _ in 0..50 {
            let (sink, mut receiver) = EventSink::channel(2);
            let senders: Vec<_> = (0..4)
                .map(|sender| {
                    let sink = sink.clone();
                    tokio::spawn(async move {
                        for n in 0..200 {
                            sink.send(delta(sender * 1_000 + n)).await;
                        }
                    })
                })
                .collect();
            drop(sink);
            tokio::task::yield_now().await;
            let seen = Arc::new(Mutex::new(Vec::new()));
            let tapped = Arc::clone(&seen);
            receiver.tap(Box::new(move |event| {
                tapped.lock().unwrap().push(number(&event));
            }));
            for sender in senders {
                // An event left in the channel after the tap took its backlog would hold its
                // sender up for good: nobody reads the channel any more.
                tokio::time::timeout(std::time::Duration::from_secs(10), sender)
                    .await
                    .expect("a sender was left waiting on the channel")
                    .unwrap();
            }
            assert!(receiver.recv().await.is_none());
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 800, "every event once");
            for sender in 0..4 {
                let own: Vec<usize> = seen
                    .iter()
                    .copied()
                    .filter(|n| n / 1_000 == sender)
                    .map(|n| n % 1_000)
                    .collect();
                assert_eq!(
                    own,
                    (0..200).collect::<Vec<_>>(),
                    "sender {sender} in order"
                );
            }
        }
    }
}
