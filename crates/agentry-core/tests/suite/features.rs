//! Skills, templates and direct tool calls through the runtime, against the mock provider.

use std::fs;

use agentry_core::RunRequest;
use agentry_core::skill::Skill;
use agentry_core::template::TemplateError;
use agentry_core::tool::ResultFormat;
use agentry_core::{RunError, Runtime};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::RunStopReason;
use serde_json::json;

use super::support::{PROTOCOLS, ProbeTool, builder, limits, result_texts, run_collect};

#[tokio::test]
async fn a_skill_is_disclosed_when_called_and_sets_the_working_directory() {
    for protocol in PROTOCOLS {
        let folder = tempfile::tempdir().unwrap();
        let skill_dir = folder.path().join("pdf-report");
        fs::create_dir(&skill_dir).unwrap();
        fs::write(
            skill_dir.join("SKILL.md"),
            "---\nname: pdf_report\ndescription: Write a PDF report from data.\n---\n\
             # PDF reports\nStep 1: run `make_report` with the data file.\n",
        )
        .unwrap();
        fs::write(skill_dir.join("template.tex"), "\\documentclass{article}").unwrap();

        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "pdf_report",
            json!({}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "lookup",
            json!({"id": 1}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("Report written.")));
        let tool = ProbeTool::lookup();
        let mut builder = builder(&mock, protocol);
        builder.tool(tool.clone()).unwrap();
        builder.skill(Skill::load(&skill_dir).unwrap()).unwrap();
        builder.limits(limits());
        let mut request = RunRequest::text("report");
        request.tools = Some(vec!["*".into()]);
        let (events, output) = run_collect(&builder.build(), request).await;
        assert_eq!(output.stop_reason, RunStopReason::Completed, "{protocol:?}");

        // At first the model saw only the skill's name and description.
        let first = mock.requests()[0].body.to_string();
        assert!(first.contains("Write a PDF report from data."));
        assert!(!first.contains("Step 1"));
        // Calling it disclosed the body.
        let results = result_texts(&events);
        assert!(
            results[0].0.contains("Step 1: run `make_report`"),
            "{}",
            results[0].0
        );
        assert!(mock.requests()[1].body.to_string().contains("Step 1"));
        // Later tools run in the skill's folder (passed down, no process-wide chdir).
        let canonical = skill_dir.canonicalize().unwrap();
        assert_eq!(
            tool.executions()[0].working_dir.as_deref(),
            Some(canonical.as_path())
        );
        assert_eq!(
            output.state.working_dir.as_deref(),
            Some(canonical.as_path())
        );
        assert_ne!(std::env::current_dir().unwrap(), canonical);
        mock.check_protocol().unwrap();
    }
}

#[tokio::test]
async fn a_template_fills_the_user_turn() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(ScriptedTurn::text("Bonjour Ada!")));
        let mut builder = builder(&mock, protocol);
        builder
            .template("greet", "Greet {{ name }} in {{language}}.")
            .unwrap();
        let runtime = builder.build();
        let mut arguments = serde_json::Map::new();
        arguments.insert("name".into(), json!("Ada"));
        arguments.insert("language".into(), json!("French"));
        let (_, output) = run_collect(&runtime, RunRequest::template("greet", arguments)).await;
        assert_eq!(output.text, "Bonjour Ada!");
        assert!(
            mock.requests()[0]
                .body
                .to_string()
                .contains("Greet Ada in French.")
        );
    }
}

#[tokio::test]
async fn a_missing_template_variable_is_a_clear_error() {
    let mock = MockProvider::start().await.unwrap();
    let mut builder = builder(&mock, agentry_llm::Protocol::OpenAi);
    builder
        .template("greet", "Greet {{ name }} in {{ language }}.")
        .unwrap();
    let runtime = builder.build();
    let mut arguments = serde_json::Map::new();
    arguments.insert("name".into(), json!("Ada"));
    let error = runtime
        .stream(RunRequest::template("greet", arguments))
        .err()
        .unwrap();
    match error {
        RunError::Template(TemplateError::MissingVariable { variable, .. }) => {
            assert_eq!(variable, "language")
        }
        other => panic!("expected a missing variable, got {other:?}"),
    }
    assert!(
        runtime
            .stream(RunRequest::template("nope", Default::default()))
            .err()
            .unwrap()
            .to_string()
            .contains("nope")
    );
    assert_eq!(mock.request_count(), 0);
}

#[tokio::test]
async fn a_direct_call_with_json_format() {
    struct Fenced;
    impl agentry_core::tool::Tool for Fenced {
        fn spec(&self) -> &agentry_types::ToolSpec {
            static SPEC: std::sync::OnceLock<agentry_types::ToolSpec> = std::sync::OnceLock::new();
            SPEC.get_or_init(|| {
                agentry_types::ToolSpec::new(
                    "report",
                    "",
                    json!({"type": "object", "properties": {}}),
                )
            })
        }
        fn call(
            &self,
            _: serde_json::Value,
            _: agentry_core::tool::ToolContext,
        ) -> futures::future::BoxFuture<
            'static,
            Result<agentry_core::tool::ToolOutput, agentry_core::tool::ToolError>,
        > {
            Box::pin(async {
                Ok(agentry_core::tool::ToolOutput::text(
                    "Here you go:\n```json\n{\"total\": 42, \"items\": [1, 2]}\n```\nDone.",
                ))
            })
        }
    }
    let mut builder = Runtime::builder();
    builder
        .tool(Fenced)
        .unwrap()
        .tool(ProbeTool::lookup())
        .unwrap();
    let runtime = builder.build();
    let value = runtime
        .call_tool("report", json!({}), ResultFormat::Json)
        .await
        .unwrap();
    assert_eq!(value, json!({"total": 42, "items": [1, 2]}));
    let echoed = runtime
        .call_tool("lookup", json!({"id": 5}), ResultFormat::Json)
        .await
        .unwrap();
    assert_eq!(echoed, json!({"echo": {"id": 5}}));
    let invalid = runtime
        .call_tool("lookup", json!({"id": "x"}), ResultFormat::Json)
        .await
        .unwrap_err();
    assert!(invalid.to_string().contains("/id"));
}

#[tokio::test]
async fn requests_are_validated_before_anything_runs() {
    let mock = MockProvider::start().await.unwrap();
    let runtime = builder(&mock, agentry_llm::Protocol::OpenAi).build();
    assert!(matches!(
        runtime.stream(RunRequest::default()).err(),
        Some(RunError::EmptyInput)
    ));
    assert!(matches!(
        runtime
            .stream(RunRequest::text("x").with_model("gpt-9"))
            .err(),
        Some(RunError::UnknownModel(_))
    ));
    assert!(matches!(
        runtime
            .stream(RunRequest::text("x").with_tools(vec!["nope".into()]))
            .err(),
        Some(RunError::Tool(_))
    ));
    assert!(matches!(
        Runtime::builder()
            .build()
            .stream(RunRequest::text("x"))
            .err(),
        Some(RunError::NoModel)
    ));
    assert_eq!(mock.request_count(), 0);
}
