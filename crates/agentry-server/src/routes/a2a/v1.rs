//! A2A 1.0 beside 0.3 on the same endpoint. A request naming a 1.0 method (`SendMessage`,
//! `SendStreamingMessage`, `GetTask`, `CancelTask`, `SubscribeToTask`, …) is put in its 0.3
//! form on the way in — roles `ROLE_USER`/`ROLE_AGENT`, parts without `kind` (`text`, `data`,
//! `raw`/`url` with `mediaType` and `filename`), `configuration.returnImmediately` — and its
//! answer in 1.0's shapes on the way out: a sent message's result and each stream event wrapped
//! by what it holds (`task`, `message`, `statusUpdate`, `artifactUpdate`), task states as
//! `TASK_STATE_*`, no `kind` fields. Errors keep their codes. The card lists both interfaces.

use serde_json::{Map, Value, json};

/// The 0.3 method a 1.0 method is, if it is one.
pub(crate) fn v03_method(method: &str) -> Option<&'static str> {
    Some(match method {
        "SendMessage" => "message/send",
        "SendStreamingMessage" => "message/stream",
        "GetTask" => "tasks/get",
        "CancelTask" => "tasks/cancel",
        "SubscribeToTask" => "tasks/resubscribe",
        "ListTasks" => "tasks/list",
        "GetExtendedAgentCard" => "agent/getAuthenticatedExtendedCard",
        "CreateTaskPushNotificationConfig" => "tasks/pushNotificationConfig/set",
        "GetTaskPushNotificationConfig" => "tasks/pushNotificationConfig/get",
        "ListTaskPushNotificationConfigs" => "tasks/pushNotificationConfig/list",
        "DeleteTaskPushNotificationConfig" => "tasks/pushNotificationConfig/delete",
        _ => return None,
    })
}

/// A 1.0 request's parameters in their 0.3 form.
pub(crate) fn params_to_v03(mut params: Value) -> Value {
    if let Some(message) = params.get_mut("message") {
        message_to_v03(message);
    }
    // `ListTasks`' state filter, as 0.3 names states.
    if let Some(status) = params.get_mut("status")
        && let Some(name) = status.as_str().and_then(state_to_v03)
    {
        *status = json!(name);
    }
    if let Some(Value::Object(configuration)) = params.get_mut("configuration")
        && let Some(immediately) = configuration.remove("returnImmediately")
    {
        let blocking = !immediately.as_bool().unwrap_or(false);
        configuration.insert("blocking".into(), Value::Bool(blocking));
    }
    params
}

fn message_to_v03(message: &mut Value) {
    let Value::Object(message) = message else {
        return;
    };
    message.insert("kind".into(), json!("message"));
    if let Some(role) = message.get_mut("role") {
        *role = json!(match role.as_str() {
            Some("ROLE_AGENT") => "agent",
            Some("ROLE_USER") => "user",
            _ => return,
        });
    }
    if let Some(Value::Array(parts)) = message.get_mut("parts") {
        for part in parts {
            part_to_v03(part);
        }
    }
}

fn part_to_v03(part: &mut Value) {
    let Value::Object(map) = part else {
        return;
    };
    let metadata = map.remove("metadata");
    let mut v03 = if let Some(text) = map.remove("text") {
        json!({"kind": "text", "text": text})
    } else if let Some(data) = map.remove("data") {
        // 0.3's data is an object; another value travels as `{"value": …}`.
        let data = if data.is_object() {
            data
        } else {
            json!({"value": data})
        };
        json!({"kind": "data", "data": data})
    } else {
        let mut file = Map::new();
        if let Some(raw) = map.remove("raw") {
            file.insert("bytes".into(), raw);
        }
        if let Some(url) = map.remove("url") {
            file.insert("uri".into(), url);
        }
        if let Some(media_type) = map.remove("mediaType") {
            file.insert("mimeType".into(), media_type);
        }
        if let Some(filename) = map.remove("filename") {
            file.insert("name".into(), filename);
        }
        json!({"kind": "file", "file": file})
    };
    if let Some(metadata) = metadata {
        v03["metadata"] = metadata;
    }
    *part = v03;
}

/// A 0.3 result of `method` (the 1.0 name) in 1.0's shape.
pub(crate) fn result_to_v10(method: &str, result: Value) -> Value {
    match method {
        "SendMessage" | "SendStreamingMessage" | "SubscribeToTask" => wrapped(result),
        "GetTask" | "CancelTask" => task_to_v10(result),
        "ListTasks" => {
            let mut result = result;
            if let Some(Value::Array(tasks)) = result.get_mut("tasks") {
                for task in tasks.iter_mut() {
                    *task = task_to_v10(std::mem::take(task));
                }
            }
            result
        }
        _ => result,
    }
}

/// A task, message or update, wrapped by what it is (1.0's `SendMessageResponse` and
/// `StreamResponse`).
fn wrapped(value: Value) -> Value {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        "task" => json!({"task": task_to_v10(value)}),
        "message" => json!({"message": message_to_v10(value)}),
        "status-update" => json!({"statusUpdate": update_to_v10(value)}),
        "artifact-update" => json!({"artifactUpdate": update_to_v10(value)}),
        _ => value,
    }
}

fn without_kind(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        map.remove("kind");
    }
    value
}

/// Task states as 0.3 and 1.0 name them.
const STATES: [(&str, &str); 8] = [
    ("submitted", "TASK_STATE_SUBMITTED"),
    ("working", "TASK_STATE_WORKING"),
    ("input-required", "TASK_STATE_INPUT_REQUIRED"),
    ("completed", "TASK_STATE_COMPLETED"),
    ("canceled", "TASK_STATE_CANCELED"),
    ("failed", "TASK_STATE_FAILED"),
    ("rejected", "TASK_STATE_REJECTED"),
    ("auth-required", "TASK_STATE_AUTH_REQUIRED"),
];

/// A 1.0 task state (`TASK_STATE_WORKING`) as 0.3 names it (`working`).
fn state_to_v03(state: &str) -> Option<&'static str> {
    STATES
        .iter()
        .find(|(_, v10)| *v10 == state)
        .map(|(v03, _)| *v03)
}

fn state_to_v10(state: &str) -> &'static str {
    STATES
        .iter()
        .find(|(v03, _)| *v03 == state)
        .map_or("TASK_STATE_UNSPECIFIED", |(_, v10)| *v10)
}

fn status_to_v10(status: &mut Value) {
    if let Some(state) = status.get_mut("state") {
        *state = json!(state_to_v10(state.as_str().unwrap_or_default()));
    }
    if let Some(message) = status.get_mut("message") {
        *message = message_to_v10(message.take());
    }
}

fn task_to_v10(task: Value) -> Value {
    let mut task = without_kind(task);
    if let Some(status) = task.get_mut("status") {
        status_to_v10(status);
    }
    if let Some(Value::Array(history)) = task.get_mut("history") {
        for message in history.iter_mut() {
            *message = message_to_v10(message.take());
        }
    }
    if let Some(Value::Array(artifacts)) = task.get_mut("artifacts") {
        for artifact in artifacts.iter_mut() {
            artifact_to_v10(artifact);
        }
    }
    task
}

fn message_to_v10(message: Value) -> Value {
    let mut message = without_kind(message);
    if let Some(role) = message.get_mut("role") {
        *role = json!(match role.as_str() {
            Some("user") => "ROLE_USER",
            Some("agent") => "ROLE_AGENT",
            _ => "ROLE_UNSPECIFIED",
        });
    }
    if let Some(Value::Array(parts)) = message.get_mut("parts") {
        for part in parts.iter_mut() {
            *part = part_to_v10(part.take());
        }
    }
    message
}

fn artifact_to_v10(artifact: &mut Value) {
    if let Some(Value::Array(parts)) = artifact.get_mut("parts") {
        for part in parts.iter_mut() {
            *part = part_to_v10(part.take());
        }
    }
}

fn part_to_v10(part: Value) -> Value {
    let Value::Object(mut map) = part else {
        return part;
    };
    let kind = map.remove("kind");
    let mut v10 = Map::new();
    match kind.as_ref().and_then(Value::as_str) {
        Some("file") => {
            let file = map.remove("file").unwrap_or_default();
            for (from, to) in [
                ("bytes", "raw"),
                ("uri", "url"),
                ("mimeType", "mediaType"),
                ("name", "filename"),
            ] {
                if let Some(value) = file.get(from) {
                    v10.insert(to.into(), value.clone());
                }
            }
        }
        _ => {
            for field in ["text", "data"] {
                if let Some(value) = map.remove(field) {
                    v10.insert(field.into(), value);
                }
            }
        }
    }
    if let Some(metadata) = map.remove("metadata") {
        v10.insert("metadata".into(), metadata);
    }
    Value::Object(v10)
}

fn update_to_v10(update: Value) -> Value {
    let mut update = without_kind(update);
    if let Some(status) = update.get_mut("status") {
        status_to_v10(status);
    }
    if let Some(artifact) = update.get_mut("artifact") {
        artifact_to_v10(artifact);
    }
    update
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v10_message_becomes_v03_and_answers_go_back() {
        let params = params_to_v03(json!({
            "message": {"messageId": "m", "role": "ROLE_USER", "parts": [
                {"text": "hi"}, {"data": {"a": 1}}, {"url": "https://x/y.png", "mediaType": "image/png"}]},
            "configuration": {"returnImmediately": true},
        }));
        assert_eq!(
            params,
            json!({
                "message": {"kind": "message", "messageId": "m", "role": "user", "parts": [
                    {"kind": "text", "text": "hi"}, {"kind": "data", "data": {"a": 1}},
                    {"kind": "file", "file": {"uri": "https://x/y.png", "mimeType": "image/png"}}]},
                "configuration": {"blocking": false},
            })
        );
        let task = json!({"kind": "task", "id": "t", "contextId": "c",
            "status": {"state": "input-required", "message": {"kind": "message", "role": "agent",
                "parts": [{"kind": "data", "data": {"pending": []}}]}},
            "artifacts": [{"artifactId": "a", "parts": [{"kind": "text", "text": "answer"}]}]});
        assert_eq!(
            result_to_v10("SendMessage", task),
            json!({"task": {"id": "t", "contextId": "c",
                "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {"role": "ROLE_AGENT",
                    "parts": [{"data": {"pending": []}}]}},
                "artifacts": [{"artifactId": "a", "parts": [{"text": "answer"}]}]}})
        );
        let update = json!({"kind": "artifact-update", "taskId": "t", "append": true,
            "artifact": {"artifactId": "a", "parts": [{"kind": "text", "text": "more"}]}});
        assert_eq!(
            result_to_v10("SendStreamingMessage", update),
            json!({"artifactUpdate": {"taskId": "t", "append": true,
                "artifact": {"artifactId": "a", "parts": [{"text": "more"}]}}})
        );
        assert_eq!(v03_method("GetTask"), Some("tasks/get"));
        assert_eq!(v03_method("tasks/get"), None);
    }
}
