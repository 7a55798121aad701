//! The tools' logic over a fake [`SubRuns`]: what child runs they would start, and what they
//! refuse.

use std::sync::{Arc, Mutex};

use agentry_types::{RunId, SessionId, ToolResultPart, ToolSpec};
use futures::future::BoxFuture;
use serde_json::json;

use super::*;
use agentry_core::access::Grant;
use agentry_core::network::NetworkPolicy;
use agentry_core::subrun::{AgentEntry, AgentTarget, ChildLink, ChildRun, SubRunError, SubRuns};
use agentry_core::tool::{CallerInfo, ToolContext, ToolError, ToolOutput};
use agentry_core::{Input, RunRequest};

#[derive(Default)]
struct Recorded {
    agents: Vec<AgentTarget>,
    depth: u32,
    started: Vec<(ChildLink, RunRequest, String)>,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<Recorded>>);

impl Fake {
    fn started(&self) -> Vec<(ChildLink, RunRequest, String)> {
        self.0.lock().unwrap().started.clone()
    }
}

impl SubRuns for Fake {
    fn find_agents(
        &self,
        target: &str,
    ) -> BoxFuture<'static, Result<Vec<AgentTarget>, SubRunError>> {
        let recorded = self.0.lock().unwrap();
        let found: Vec<AgentTarget> = recorded
            .agents
            .iter()
            .filter(|a| a.id == target || (target == "team" && a.nickname.is_some()))
            .cloned()
            .collect();
        Box::pin(async move { Ok(found) })
    }

    fn directory(&self) -> BoxFuture<'static, Result<Vec<AgentEntry>, SubRunError>> {
        let entries = self
            .0
            .lock()
            .unwrap()
            .agents
            .iter()
            .map(|a| AgentEntry {
                id: a.id.clone(),
                nickname: a.nickname.clone(),
                labels: Vec::new(),
            })
            .collect();
        Box::pin(async move { Ok(entries) })
    }

    fn depth_of(&self, _session: SessionId) -> BoxFuture<'static, Result<u32, SubRunError>> {
        let depth = self.0.lock().unwrap().depth;
        Box::pin(async move { Ok(depth) })
    }

    fn start(
        &self,
        link: ChildLink,
        request: RunRequest,
        title: String,
    ) -> BoxFuture<'static, Result<ChildRun, SubRunError>> {
        let agent = link.agent_id.clone();
        self.0.lock().unwrap().started.push((link, request, title));
        Box::pin(async move {
            Err(SubRunError::Failed(format!(
                "not started ({})",
                agent.unwrap_or_default()
            )))
        })
    }
}

fn spec(name: &str) -> ToolSpec {
    ToolSpec::new(
        name,
        format!("tool {name}\nmore detail"),
        json!({"type": "object"}),
    )
}

fn context(agent: Option<&str>) -> (ToolContext, Arc<CallerInfo>) {
    let caller = Arc::new(CallerInfo {
        run_id: RunId::new(),
        session: Some(SessionId::new()),
        model: "caller-model".into(),
        tools: vec![spec("a"), spec("b"), spec(DELEGATE)],
        agent_id: agent.map(str::to_owned),
        approvals: serde_json::from_value(json!({"tools": {"a": "always"}})).unwrap(),
        network: vec![NetworkPolicy::Allow(vec!["docs.rs".into()])],
        grant: Some(Grant {
            agents: Some(vec!["writer".into()]),
            models: Some(vec!["caller-model".into()]),
            tools: Some(vec!["a".into(), "b".into(), DELEGATE.into()]),
            no_commands: false,
        }),
    });
    let mut context = ToolContext::detached("call-1");
    context.caller = Some(Arc::clone(&caller));
    (context, caller)
}

fn target(id: &str, team: bool, tools: &[&str]) -> AgentTarget {
    AgentTarget {
        id: id.into(),
        nickname: team.then(|| id.to_uppercase()),
        request: Ok(RunRequest {
            model: Some(format!("{id}-model")),
            fallback_models: vec!["backup".into()],
            system: Some(format!("You are {id}.")),
            tools: Some(tools.iter().map(|t| (*t).to_owned()).collect()),
            agent_id: Some(id.into()),
            ..RunRequest::default()
        }),
    }
}

async fn delegate(
    fake: &Fake,
    arguments: serde_json::Value,
    context: ToolContext,
) -> Result<ToolOutput, ToolError> {
    DelegateTool::new(Arc::new(fake.clone()), DelegationConfig::default())
        .call(arguments, context)
        .await
}

#[tokio::test]
async fn delegate_starts_a_child_with_the_callers_model_tools_and_table() {
    let fake = Fake::default();
    fake.0.lock().unwrap().depth = 1;
    let (context, caller) = context(None);
    let error = delegate(
        &fake,
        json!({"task": "Sum it up.", "context": "Numbers are in a.txt."}),
        context,
    )
    .await
    .unwrap_err();
    assert_eq!(error, ToolError::Failed("not started ()".into()));
    let started = fake.started();
    assert_eq!(started.len(), 1);
    let (link, request, title) = &started[0];
    assert_eq!(
        link,
        &ChildLink {
            parent_session_id: caller.session,
            parent_run_id: caller.run_id,
            call_id: "call-1".into(),
            depth: 2,
            tool: DELEGATE.into(),
            agent_id: None,
        }
    );
    assert_eq!(title, "delegate: Sum it up.");
    assert_eq!(request.model.as_deref(), Some("caller-model"));
    assert_eq!(
        request.tools.as_deref(),
        Some(&["a".to_owned(), "b".into(), DELEGATE.into()][..])
    );
    let system = request.system.as_deref().unwrap();
    assert!(
        system.contains("| a | tool a |\n| b | tool b |"),
        "{system}"
    );
    assert!(!system.contains("more detail"));
    assert!(system.contains("Numbers are in a.txt."));
    assert_eq!(
        request.input,
        Some(Input::Text {
            text: "Sum it up.".into()
        })
    );
    // The caller's approvals hold for the sub-agent.
    assert_eq!(request.approvals.as_ref(), Some(&caller.approvals));
    // So does its network narrowing.
    assert_eq!(request.network, caller.network);
    // And its caller's grant, which the child's start checks.
    assert_eq!(request.grant, caller.grant);
}

#[tokio::test]
async fn delegate_gives_only_tools_the_caller_has() {
    let fake = Fake::default();
    let error = delegate(
        &fake,
        json!({"task": "t", "tools": ["a", "secret"]}),
        context(None).0,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&error, ToolError::Failed(m) if m.contains("you do not have: secret")),
        "{error}"
    );
    assert!(fake.started().is_empty());

    // A saved agent's tools are cut down to the caller's; `model` overrides the agent's model
    // and drops its fallbacks.
    fake.0.lock().unwrap().agents = vec![target("helper", false, &["a", "x"])];
    let _ = delegate(
        &fake,
        json!({"task": "t", "agent": "helper"}),
        context(None).0,
    )
    .await;
    let _ = delegate(
        &fake,
        json!({"task": "t", "agent": "helper", "model": "other"}),
        context(None).0,
    )
    .await;
    let started = fake.started();
    let (link, request, _) = &started[0];
    assert_eq!(link.agent_id.as_deref(), Some("helper"));
    assert_eq!(request.agent_id.as_deref(), Some("helper"));
    assert_eq!(request.model.as_deref(), Some("helper-model"));
    assert_eq!(request.fallback_models, ["backup"]);
    assert_eq!(request.tools.as_deref(), Some(&["a".to_owned()][..]));
    // An agent the caller's grant allows brings its own tools; its agent and model stay held.
    let grant = request.grant.as_ref().unwrap();
    assert_eq!(grant.tools, Some(vec!["a".to_owned(), "x".into()]));
    assert_eq!(grant.agents, Some(vec!["writer".to_owned()]));
    assert_eq!(grant.models, Some(vec!["caller-model".to_owned()]));
    assert!(
        request
            .system
            .as_deref()
            .unwrap()
            .contains("You are helper.")
    );
    let (_, request, _) = &started[1];
    assert_eq!(request.model.as_deref(), Some("other"));
    assert!(request.fallback_models.is_empty());
}

#[tokio::test]
async fn delegate_refuses_bad_calls() {
    let fake = Fake::default();
    let blank = delegate(&fake, json!({"task": "  "}), context(None).0).await;
    assert!(matches!(blank, Err(ToolError::InvalidArguments(_))));
    let unknown_field = delegate(&fake, json!({"task": "t", "x": 1}), context(None).0).await;
    assert!(matches!(unknown_field, Err(ToolError::InvalidArguments(_))));
    let outside = delegate(&fake, json!({"task": "t"}), ToolContext::detached("c")).await;
    assert!(matches!(outside, Err(ToolError::Failed(m)) if m.contains("inside a run")));
    let no_agent = delegate(
        &fake,
        json!({"task": "t", "agent": "ghost"}),
        context(None).0,
    )
    .await;
    assert!(matches!(no_agent, Err(ToolError::Failed(m)) if m.contains("\"ghost\"")));
    fake.0.lock().unwrap().depth = 3;
    let deep = delegate(&fake, json!({"task": "t"}), context(None).0).await;
    assert!(
        matches!(&deep, Err(ToolError::Failed(m)) if m.contains("depth limit (3)")),
        "{deep:?}"
    );
    assert!(fake.started().is_empty());
}

#[tokio::test]
async fn talk_to_addresses_each_agent_once_in_order_never_the_caller() {
    let fake = Fake::default();
    fake.0.lock().unwrap().agents = vec![
        target("me", true, &[]),
        target("ann", true, &[]),
        target("bob", true, &[]),
        target("cy", false, &[]),
    ];
    let tool = TalkToTool::new(Arc::new(fake.clone()), DelegationConfig::default());
    let output = tool
        .call(
            json!({"agents": ["cy", "team", "nobody", "ann"], "message": "Hi"}),
            context(Some("me")).0,
        )
        .await
        .unwrap();
    let started = fake.started();
    let order: Vec<&str> = started
        .iter()
        .map(|(link, _, _)| link.agent_id.as_deref().unwrap())
        .collect();
    assert_eq!(order, ["cy", "ann", "bob"]);
    assert!(started.iter().all(|(link, request, _)| link.tool == TALK_TO
        && link.depth == 1
        && request.agent_id == link.agent_id));
    let ToolResultPart::Text { text } = &output.content[0] else {
        panic!("a text part first: {output:?}");
    };
    let positions: Vec<usize> = [
        "**cy** (cy): error",
        "**ANN** (ann): error",
        "**BOB** (bob): error",
        "**nobody**: error: no agent matches \"nobody\"; the agents are: ann (ANN); bob (BOB); cy",
    ]
    .iter()
    .map(|needle| {
        text.find(needle)
            .unwrap_or_else(|| panic!("{needle} in {text}"))
    })
    .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{text}");
    // Every target failed here, so the result is an error; a target's failure alone is not.
    assert!(output.is_error);

    let refused = tool
        .call(
            json!({"agents": ["me"], "message": "Hi"}),
            context(Some("me")).0,
        )
        .await;
    assert!(
        matches!(&refused, Err(ToolError::Failed(m)) if m.contains("cannot talk_to itself")),
        "{refused:?}"
    );
    assert_eq!(fake.started().len(), 3);
}
