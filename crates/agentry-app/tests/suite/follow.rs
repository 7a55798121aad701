//! Following a run at the app's boundary (`App::follow`): from its start, after a seq, mid-run,
//! and by a follower that reads nothing until the run is over (issue 49).

use std::sync::Arc;
use std::time::Duration;

use agentry_app::auth::Principal;
use agentry_app::follow::{FollowFrom, Followed};
use agentry_app::hub::Subscription;
use agentry_app::runs::{RunSpec, SessionChoice, Target, prepare, start_in_session};
use agentry_app::{App, McpStart};
use agentry_core::Input;
use agentry_core::session::BusyPolicy;
use agentry_store::{ConfigKind, Store};
use agentry_testkit::{Chunking, MockProvider, Reply, ScriptedTurn};
use agentry_types::{RunEvent, SessionEvent, SessionId};
use futures::StreamExt;
use serde_json::json;

/// An app over a fresh SQLite store whose one model is the mock, and the mock.
pub(super) async fn app() -> (App, MockProvider, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    let mock = MockProvider::start().await.unwrap();
    store
        .put_config(
            ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(),
                    "model_name": "m"}),
        )
        .await
        .unwrap();
    let app = App::builder(store)
        .mcp(McpStart::None)
        .build()
        .await
        .unwrap();
    (app, mock, home)
}

/// Starts `text` in a new session, as every front-end does.
async fn start(app: &App, text: &str) -> (SessionId, Subscription) {
    let input = RunSpec {
        model_id: Some("mock".into()),
        input: Some(Input::Text { text: text.into() }),
        session: SessionChoice::New,
        ..RunSpec::default()
    };
    let (target, request) = prepare(app, &Principal::operator(), input).await.unwrap();
    let Target::Session(session) = target else {
        panic!("a new session's run has its session");
    };
    let subscription = start_in_session(app, session, request, BusyPolicy::Reject)
        .await
        .unwrap();
    (session, subscription)
}

pub(super) async fn collect(events: Followed) -> Vec<Arc<RunEvent>> {
    tokio::time::timeout(
        Duration::from_secs(30),
        events.map(Result::unwrap).collect(),
    )
    .await
    .expect("the followed run ends")
}

/// Everything of a run followed from `subscription`, made when it started.
async fn from_start(
    app: &App,
    session: SessionId,
    subscription: Subscription,
) -> Vec<Arc<RunEvent>> {
    let first = None;
    let events = app.follow(
        session,
        FollowFrom::Live {
            subscription,
            first,
        },
    );
    collect(events.await.unwrap()).await
}

/// The seqs of the session's log.
async fn logged_seqs(app: &App, session: SessionId) -> Vec<u64> {
    let logged = app.sessions().logged_events(session, 0).await.unwrap();
    logged.into_iter().map(|(seq, _)| seq).collect()
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

/// The seqs of the committed steps among `events`.
fn seqs(events: &[Arc<RunEvent>]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|event| match event.as_ref() {
            RunEvent::Committed { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect()
}

async fn wait_until_over(app: &App, session: SessionId) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while app.hub().is_live(session) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_run_followed_from_its_start_comes_in_order_and_ends_with_it() {
    let (app, mock, _home) = app().await;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Hello there, friend.")));
    let (session, subscription) = start(&app, "Hi").await;
    let events = from_start(&app, session, subscription).await;
    assert!(
        matches!(
            events.first().map(AsRef::as_ref),
            Some(RunEvent::Committed {
                event: SessionEvent::RunStarted { .. },
                ..
            })
        ),
        "{events:?}"
    );
    assert!(events.last().unwrap().is_terminal(), "{events:?}");
    assert_eq!(streamed(&events), "Hello there, friend.");
    let seqs = seqs(&events);
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{seqs:?}");
}

#[tokio::test]
async fn a_follower_that_reads_nothing_until_the_end_gets_every_delta() {
    let (app, mock, _home) = app().await;
    // 3,000 deltas: far more than the live channel keeps for a subscriber that reads nothing.
    let answer: String = (0..3_000)
        .map(|index| format!("w{index}"))
        .collect::<Vec<_>>()
        .join(" ");
    mock.enqueue(Reply::scripted(ScriptedTurn::text(answer.as_str())));
    let (session, subscription) = start(&app, "Write it all.").await;
    let first = None;
    let events = app
        .follow(
            session,
            FollowFrom::Live {
                subscription,
                first,
            },
        )
        .await
        .unwrap();
    wait_until_over(&app, session).await;
    let events = collect(events).await;
    assert_eq!(streamed(&events).len(), answer.len());
    assert_eq!(streamed(&events), answer);
    // Each committed step once, in order, the run's whole record.
    let sent = seqs(&events);
    let logged = logged_seqs(&app, session).await;
    assert_eq!(sent, logged);
    assert!(events.last().unwrap().is_terminal(), "{:?}", events.last());
}

#[tokio::test]
async fn following_a_finished_session_after_a_seq_gives_the_rest_and_ends() {
    let (app, mock, _home) = app().await;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Done.")));
    let (session, subscription) = start(&app, "Go").await;
    from_start(&app, session, subscription).await;
    let logged = logged_seqs(&app, session).await;
    let events = collect(app.follow(session, FollowFrom::After(2)).await.unwrap()).await;
    assert_eq!(seqs(&events), logged[2..]);
    let last = *logged.last().unwrap();
    let nothing = collect(app.follow(session, FollowFrom::After(last)).await.unwrap()).await;
    assert!(nothing.is_empty(), "{nothing:?}");
    // A session that does not exist is the call's error, not a stream's.
    let missing = app.follow(SessionId::new(), FollowFrom::After(0)).await;
    assert!(missing.is_err());
}

#[tokio::test]
async fn attaching_mid_run_starts_with_the_text_so_far() {
    let (app, mock, _home) = app().await;
    let answer = "one two three four five six seven eight nine ten eleven twelve";
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text(answer))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(40)),
    );
    let (session, _subscription) = start(&app, "Count.").await;
    // Some words are out when a client attaches from the beginning of the session.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(app.hub().is_live(session));
    let events = collect(app.follow(session, FollowFrom::After(0)).await.unwrap()).await;
    assert_eq!(streamed(&events), answer);
    assert!(events.last().unwrap().is_terminal(), "{:?}", events.last());
}
