//! Skill folders registered on their own: the seed's `POST /v1/tools/skill` and Agentry's
//! `/v1/skills`, listed among the tools, offered to runs by name (the seed's `skill-<name>` id
//! too), replaced, refused when bad, and removed.

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::start;

/// A skill folder `<dir>/<name>` with a SKILL.md naming it `skill_name`.
fn skill(dir: &std::path::Path, name: &str, skill_name: &str) -> String {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("SKILL.md"),
        format!(
            "---\nname: {skill_name}\ndescription: The {skill_name} skill.\n---\nDo it well.\n"
        ),
    )
    .unwrap();
    folder.canonicalize().unwrap().display().to_string()
}

fn named<'a>(list: &'a Value, key: &str, field: &str, value: &str) -> Option<&'a Value> {
    list[key]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry[field] == value)
}

#[tokio::test]
async fn skill_folders_are_registered_offered_replaced_and_removed() {
    let server = start().await;
    let root = server.home.path().join("skills");
    let path = skill(&root, "summarise", "summarise");

    // The seed's registration and listing.
    let (status, body) = server
        .post("/linglong/v1/tools/skill", json!({"skill_dir": path}))
        .await;
    assert_eq!(
        (status, body),
        (
            201,
            json!({"status": "registered", "tool_id": "skill-summarise"})
        )
    );
    let (_, tools) = server.get("/linglong/v1/tools").await;
    let entry = named(&tools, "tools", "tool_id", "skill-summarise").unwrap();
    assert_eq!(entry["tool_type"], "skill");
    assert_eq!(entry["skill_dir"], path);
    assert_eq!(entry["description"], "The summarise skill.");
    // Agentry's listings.
    let (_, tools) = server.get("/v1/tools").await;
    assert_eq!(
        named(&tools, "tools", "name", "summarise").unwrap()["kind"],
        "skill"
    );
    let (_, skills) = server.get("/v1/skills").await;
    assert_eq!(
        skills,
        json!({"skills": [{"name": "summarise", "description": "The summarise skill.", "path": path}]})
    );

    // A run is offered it by the seed's id.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Done.")));
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "tool_ids": ["skill-summarise"], "text": "Summarise."}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let offered: Vec<String> = server.mock.requests()[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(offered, ["summarise"]);

    // Registered again (Agentry's route): replaced, 200.
    let (status, body) = server.post("/v1/skills", json!({"path": path})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["name"], "summarise");

    // Bad folders and bodies are refused, and nothing is stored.
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = skill(elsewhere.path(), "outside", "outside");
    let clash = skill(&root, "clock", "current_time");
    for (body, status) in [
        (json!({}), 400),
        (json!({"skill_dir": ""}), 400),
        (json!({"skill_dir": 7}), 400),
        (json!({"skill_dir": path, "extra": 1}), 400),
        (json!({"skill_dir": "/no/such/folder"}), 400),
        (json!({"skill_dir": empty.display().to_string()}), 400),
        (json!({"skill_dir": outside}), 400),
        (json!({"skill_dir": clash}), 409),
    ] {
        let (got, answer) = server.post("/linglong/v1/tools/skill", body.clone()).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
    }
    let (status, _) = server.post("/v1/skills", json!({"path": outside})).await;
    assert_eq!(status, 400);
    let (_, skills) = server.get("/v1/skills").await;
    assert_eq!(skills["skills"].as_array().unwrap().len(), 1);

    // Removed through the seed's tool route; then gone from every listing.
    let (status, body) = server
        .raw(
            reqwest::Method::DELETE,
            "/linglong/v1/tools/skill-summarise",
            "",
        )
        .await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({"status": "deleted", "tool_id": "skill-summarise"})
        )
    );
    let (_, skills) = server.get("/v1/skills").await;
    assert_eq!(skills, json!({"skills": []}));
    let (_, tools) = server.get("/v1/tools").await;
    assert!(named(&tools, "tools", "name", "summarise").is_none());
    let (status, _) = server
        .raw(reqwest::Method::DELETE, "/v1/skills/summarise", "")
        .await;
    assert_eq!(status, 404);
    assert!(std::path::Path::new(&path).join("SKILL.md").is_file());
}
