//! Following a session's run: the one way every front-end reads a run as it goes.
//!
//! [`App::follow`] yields the run's events — from a subscription made when the run started or
//! attached to mid-run (its partial step first), or after a seq a client already has (the
//! log's events after it, then the step in progress) — until the run ends. It owns what the
//! live channel cannot promise: a subscriber that falls behind it (the channel keeps the last
//! [`crate::hub`] events) reads the committed steps it missed back from the log, and the answer
//! text it missed arrives as one delta before the step that committed it, so a client that
//! builds the answer from deltas gets every byte, in order. A run live on another node is
//! followed through the log until it ends or comes here.
//!
//! The bookkeeping is [`Follower`], a plain state machine (events in, events out) with tests
//! of its own; the stream around it only receives, reads the log and yields.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::broadcast::error::RecvError;

use agentry_types::{AssistantPart, RunEvent, SessionEvent, SessionId, Thinking};

use crate::hub::{Partial, RunProgress, Subscription};
use crate::{App, AppError};

/// How often a run live on another node is read from the log.
const TAIL_POLL: Duration = Duration::from_millis(200);

/// A run's events as [`App::follow`] yields them; an error (the log could not be read) is the
/// last item.
pub type Followed = BoxStream<'static, Result<Arc<RunEvent>, AppError>>;

/// Where following begins.
pub enum FollowFrom {
    /// From a subscription: one made when the run started (nothing of it seen yet), or one
    /// made mid-run (its partial step comes first). `first` is an event the caller already took
    /// from it and has not yet handled: it comes first.
    Live {
        /// The subscription.
        subscription: Subscription,
        /// An event already received from it.
        first: Option<Arc<RunEvent>>,
    },
    /// After the session's event `seq` (what the client already has): the log's events after
    /// it, the step in progress, then the live run, here or on another node.
    After(u64),
}

impl App {
    /// A session's run as it goes, from `from`, until it ends (see the module's docs). With
    /// [`FollowFrom::After`] the log's backlog is read first, and its error is this call's.
    pub async fn follow(&self, session: SessionId, from: FollowFrom) -> Result<Followed, AppError> {
        let app = self.clone();
        let (mut follower, backlog, live, tail) = match from {
            FollowFrom::Live {
                subscription,
                first,
            } => {
                let mut follower = Follower::new(subscription.partial.seq);
                let mut backlog = follower.resume(&subscription.partial);
                if let Some(first) = first {
                    backlog.extend(follower.live(first));
                }
                (follower, backlog, Some(subscription), false)
            }
            FollowFrom::After(after) => {
                // Subscribe before reading the log, so nothing falls between the two; the
                // follower drops by seq what both hold.
                let live = self.parts.hub.subscribe(session);
                let mut follower = Follower::new(after);
                let mut backlog = Vec::new();
                for (seq, event) in self.sessions().logged_events(session, after).await? {
                    backlog.extend(follower.logged(seq, event));
                }
                let (live, tail) = match live {
                    Some(subscription) if !follower.ended() => {
                        backlog.extend(follower.resume(&subscription.partial));
                        (Some(subscription), false)
                    }
                    // Running in another process (another node, or one that died before
                    // another takes it over): follow the log.
                    None if !follower.ended() => (
                        None,
                        self.parts.store.session_worker(session).await?.is_some(),
                    ),
                    _ => (None, false),
                };
                (follower, backlog, live, tail)
            }
        };
        Ok(async_stream::stream! {
            for event in backlog {
                yield Ok(event);
            }
            let mut live = live;
            if tail {
                // The run's committed steps as the other process writes them; live from the hub
                // once the run comes here.
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(TAIL_POLL) => {}
                        () = app.parts.shutdown.cancelled() => break,
                    }
                    let running = match app.parts.store.session_worker(session).await {
                        Ok(running) => running,
                        Err(error) => {
                            yield Err(AppError::from(error));
                            break;
                        }
                    };
                    match app.logged_since(session, &mut follower).await {
                        Ok(events) => {
                            for event in events {
                                yield Ok(event);
                            }
                        }
                        Err(error) => {
                            yield Err(error);
                            break;
                        }
                    }
                    if follower.ended() || running.is_none() {
                        break;
                    }
                    if let Some(subscription) = app.parts.hub.subscribe(session) {
                        for event in follower.resume(&subscription.partial) {
                            yield Ok(event);
                        }
                        live = Some(subscription);
                        break;
                    }
                }
            }
            let Some(Subscription { events: mut receiver, progress, missed, .. }) = live else {
                return;
            };
            let mut missed = missed;
            loop {
                let received = if std::mem::take(&mut missed) {
                    Err(RecvError::Lagged(0))
                } else {
                    receiver.recv().await
                };
                match received {
                    Ok(event) => {
                        let terminal = event.is_terminal();
                        for event in follower.live(event) {
                            yield Ok(event);
                        }
                        if terminal {
                            break;
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        if !follower.lagged(&progress) {
                            continue;
                        }
                        match app.logged_since(session, &mut follower).await {
                            Ok(events) => {
                                for event in events {
                                    yield Ok(event);
                                }
                            }
                            Err(error) => {
                                yield Err(error);
                                break;
                            }
                        }
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        }
        .boxed())
    }

    /// What `follower` has not sent of the session's log (after its last seq).
    async fn logged_since(
        &self,
        session: SessionId,
        follower: &mut Follower,
    ) -> Result<Vec<Arc<RunEvent>>, AppError> {
        let mut out = Vec::new();
        for (seq, event) in self
            .sessions()
            .logged_events(session, follower.last_seq())
            .await?
        {
            out.extend(follower.logged(seq, event));
        }
        Ok(out)
    }
}

/// What a follower has sent of a run, and what it owes after falling behind.
#[derive(Debug, Default)]
pub struct Follower {
    /// The highest committed seq sent (or the client had).
    last_seq: u64,
    /// Answer text sent as deltas since the last committed answer.
    text: String,
    /// Reasoning sent as deltas since the last committed answer.
    thinking: String,
    /// Live events were missed: until the live channel is back in step with what was sent,
    /// its deltas and uncommitted steps are dropped, and a committed answer brings what of it
    /// was not sent.
    behind: bool,
    /// Whether the run's end (or pause) is among the committed steps sent.
    ended: bool,
}

impl Follower {
    /// A follower of a client that has the session's events up to `after`.
    pub fn new(after: u64) -> Self {
        Self {
            last_seq: after,
            ..Self::default()
        }
    }

    /// The highest committed seq sent.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Whether the run's end (or pause) was sent among its committed steps.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// A subscription's partial step, as deltas, when it continues what was sent; when the log
    /// already went past the step it belongs to, the live events are behind what was sent.
    pub fn resume(&mut self, partial: &Partial) -> Vec<Arc<RunEvent>> {
        if partial.seq != self.last_seq {
            self.behind = true;
            return Vec::new();
        }
        let mut out = Vec::new();
        if !partial.thinking.is_empty() {
            self.thinking.clone_from(&partial.thinking);
            out.push(Arc::new(RunEvent::ThinkingDelta {
                text: partial.thinking.clone(),
            }));
        }
        if !partial.text.is_empty() {
            self.text.clone_from(&partial.text);
            out.push(Arc::new(RunEvent::TextDelta {
                text: partial.text.clone(),
            }));
        }
        out
    }

    /// The live channel skipped events. Returns whether the log must be read (after
    /// [`Self::last_seq`]): not when the run has committed nothing yet.
    pub fn lagged(&mut self, progress: &RunProgress) -> bool {
        self.behind = true;
        if self.last_seq > 0 {
            return true;
        }
        // Nothing committed sent yet: the run's steps begin at its first.
        match progress.first_seq() {
            Some(first) => {
                self.last_seq = first.saturating_sub(1);
                true
            }
            None => false,
        }
    }

    /// One live event: what to send for it.
    pub fn live(&mut self, event: Arc<RunEvent>) -> Vec<Arc<RunEvent>> {
        match event.as_ref() {
            RunEvent::Committed { seq, event: stored } => {
                let seq = *seq;
                if seq <= self.last_seq {
                    // Sent already (read from the log): from here on the live channel follows
                    // on from what was sent.
                    if self.behind && seq == self.last_seq {
                        self.caught_up();
                    }
                    return Vec::new();
                }
                let mut out = self.committed(seq, stored);
                if self.behind {
                    self.caught_up();
                }
                out.push(event);
                out
            }
            RunEvent::TextDelta { text } => {
                if self.behind {
                    return Vec::new();
                }
                self.text.push_str(text);
                vec![event]
            }
            RunEvent::ThinkingDelta { text } => {
                if self.behind {
                    return Vec::new();
                }
                self.thinking.push_str(text);
                vec![event]
            }
            // A step's live form (its committed form is what counts, and brings it again).
            RunEvent::ToolCallDelta { .. }
            | RunEvent::AssistantMessage { .. }
            | RunEvent::Usage { .. }
            | RunEvent::ToolCallStarted { .. }
            | RunEvent::ToolResult { .. }
                if self.behind =>
            {
                Vec::new()
            }
            _ => vec![event],
        }
    }

    /// One committed step read from the log: what to send for it.
    pub fn logged(&mut self, seq: u64, stored: SessionEvent) -> Vec<Arc<RunEvent>> {
        if seq <= self.last_seq {
            return Vec::new();
        }
        let mut out = self.committed(seq, &stored);
        out.push(Arc::new(RunEvent::Committed { seq, event: stored }));
        out
    }

    /// Notes a committed step not sent before, and returns what must go before it: for an
    /// answer while behind, what of its text and reasoning was not sent as deltas and its live
    /// form.
    fn committed(&mut self, seq: u64, stored: &SessionEvent) -> Vec<Arc<RunEvent>> {
        self.last_seq = seq;
        let mut out = Vec::new();
        match stored {
            SessionEvent::RunStarted { .. } | SessionEvent::RunResumed { .. } => {
                self.ended = false;
            }
            SessionEvent::RunFinished { .. } | SessionEvent::RunPaused { .. } => {
                self.ended = true;
            }
            SessionEvent::AssistantMessage {
                round,
                content,
                stop_reason,
                ..
            } => {
                if self.behind {
                    let (thinking, text) = texts(content);
                    if let Some(rest) = thinking.strip_prefix(self.thinking.as_str())
                        && !rest.is_empty()
                    {
                        out.push(Arc::new(RunEvent::ThinkingDelta {
                            text: rest.to_owned(),
                        }));
                    }
                    if let Some(rest) = text.strip_prefix(self.text.as_str())
                        && !rest.is_empty()
                    {
                        out.push(Arc::new(RunEvent::TextDelta {
                            text: rest.to_owned(),
                        }));
                    }
                    out.push(Arc::new(RunEvent::AssistantMessage {
                        round: *round,
                        content: content.clone(),
                        stop_reason: stop_reason.clone(),
                    }));
                }
                self.text.clear();
                self.thinking.clear();
            }
            _ => {}
        }
        out
    }

    /// The live channel is in step with what was sent again, at a committed step: what
    /// follows it is new.
    fn caught_up(&mut self) {
        self.behind = false;
        self.text.clear();
        self.thinking.clear();
    }
}

/// An answer's reasoning and text, each joined.
fn texts(content: &[AssistantPart]) -> (String, String) {
    let mut thinking = String::new();
    let mut text = String::new();
    for part in content {
        match part {
            AssistantPart::Text { text: part } => text.push_str(part),
            AssistantPart::Thinking(Thinking::Text { text: part, .. }) => thinking.push_str(part),
            _ => {}
        }
    }
    (thinking, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_types::{RunId, StopReason, Usage};

    fn answer(text: &str) -> SessionEvent {
        SessionEvent::AssistantMessage {
            run_id: RunId::new(),
            round: 1,
            content: vec![AssistantPart::Text { text: text.into() }],
            usage: Usage::default(),
            stop_reason: StopReason::EndTurn,
            model: None,
            agent_id: None,
            cost_usd: None,
            duration_ms: None,
            first_output_ms: None,
        }
    }

    fn delta(text: &str) -> Arc<RunEvent> {
        Arc::new(RunEvent::TextDelta { text: text.into() })
    }

    fn committed(seq: u64, event: SessionEvent) -> Arc<RunEvent> {
        Arc::new(RunEvent::Committed { seq, event })
    }

    /// The text of the deltas among `events`.
    fn streamed(events: &[Arc<RunEvent>]) -> String {
        events
            .iter()
            .filter_map(|event| match event.as_ref() {
                RunEvent::TextDelta { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    fn progress_from(first: u64) -> RunProgress {
        RunProgress::first_committed(first)
    }

    #[test]
    fn in_step_every_event_passes_unchanged() {
        let mut follower = Follower::new(4);
        let mut sent = Vec::new();
        for event in [delta("Hel"), delta("lo"), committed(5, answer("Hello"))] {
            sent.extend(follower.live(event));
        }
        assert_eq!(sent.len(), 3);
        assert_eq!(streamed(&sent), "Hello");
        assert_eq!(follower.last_seq(), 5);
    }

    #[test]
    fn text_missed_mid_answer_comes_before_its_commit() {
        // Sent "Hel", then the channel skipped "lo, wor"; the log has nothing new yet.
        let mut follower = Follower::new(4);
        let mut sent = follower.live(delta("Hel"));
        assert!(follower.lagged(&progress_from(3)));
        // The deltas still in the channel after the gap are not sent (part of the text is
        // missing before them) …
        sent.extend(follower.live(delta("ld")));
        // … the committed answer brings what was not sent, then itself.
        sent.extend(follower.live(committed(5, answer("Hello, world"))));
        assert_eq!(streamed(&sent), "Hello, world");
        // And its live form, which the gap may have taken.
        assert!(
            sent.iter()
                .any(|event| matches!(event.as_ref(), RunEvent::AssistantMessage { .. }))
        );
        // In step again: the next answer streams as it comes.
        sent.extend(follower.live(delta("Next")));
        assert_eq!(streamed(&sent), "Hello, worldNext");
    }

    #[test]
    fn answers_read_back_from_the_log_are_not_sent_twice() {
        let mut follower = Follower::new(0);
        let mut sent = follower.live(committed(1, answer("")));
        sent.extend(follower.live(delta("A")));
        assert!(follower.lagged(&progress_from(1)));
        // The log holds the rest of the first answer and a second one.
        sent.extend(follower.logged(2, answer("AB")));
        sent.extend(follower.logged(3, answer("CD")));
        // The channel still holds the tail of the second answer and its commit, then the
        // third answer's deltas.
        for event in [
            delta("D"),
            committed(3, answer("CD")),
            delta("E"),
            delta("F"),
        ] {
            sent.extend(follower.live(event));
        }
        sent.extend(follower.live(committed(4, answer("EF"))));
        assert_eq!(streamed(&sent), "ABCDEF");
        let seqs: Vec<u64> = sent
            .iter()
            .filter_map(|event| match event.as_ref() {
                RunEvent::Committed { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, [1, 2, 3, 4]);
    }

    #[test]
    fn a_gap_before_anything_committed_reads_from_the_runs_first_step() {
        let mut follower = Follower::new(0);
        assert!(follower.lagged(&progress_from(7)));
        assert_eq!(follower.last_seq(), 6);
        let mut nothing_yet = Follower::new(0);
        assert!(!nothing_yet.lagged(&RunProgress::default()));
    }

    #[test]
    fn a_partial_step_resumes_only_where_the_log_left_off() {
        let partial = Partial {
            text: "Hal".into(),
            thinking: String::new(),
            seq: 3,
        };
        let mut in_step = Follower::new(3);
        let mut sent = in_step.resume(&partial);
        sent.extend(in_step.live(delta("f")));
        sent.extend(in_step.live(committed(4, answer("Half"))));
        assert_eq!(streamed(&sent), "Half");
        // The log already holds the answer the partial text belongs to.
        let mut past = Follower::new(4);
        assert!(past.resume(&partial).is_empty());
        let mut sent = past.live(delta("f"));
        sent.extend(past.live(committed(4, answer("Half"))));
        sent.extend(past.live(delta("Next")));
        assert_eq!(streamed(&sent), "Next");
    }
}
