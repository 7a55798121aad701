//! The seed's workspace file manager (`/linglong/v1/workspace/…`) over a session's workspace:
//! listing, reading with ranges, folder and file changes, paths confined to the workspace, and a
//! 50 MB chunked upload interrupted twice and resumed.

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};
use sha2::Digest as _;

use super::support::{Server, host_commands, start_with};

/// A server whose sessions have workspaces, and one session: its id and workspace folder.
async fn with_session() -> (Server, String, std::path::PathBuf) {
    let server = start_with(
        |home| agentry_app::ToolEnvironment {
            workspaces: Some(home.join("workspaces")),
            ..host_commands(home)
        },
        |_| {},
    )
    .await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Hi.")));
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "text": "Hello", "session_id": "new"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let session = body["session_id"].as_str().unwrap().to_owned();
    let folder = server
        .state
        .app
        .parts()
        .sessions
        .workspace(session.parse().unwrap())
        .unwrap();
    std::fs::create_dir_all(&folder).unwrap();
    (server, session, folder)
}

async fn get_raw(server: &Server, path: &str, range: Option<&str>) -> reqwest::Response {
    let mut request = server.http.get(format!("{}{path}", server.url));
    if let Some(range) = range {
        request = request.header("range", range);
    }
    request.send().await.unwrap()
}

async fn send(server: &Server, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
    server.raw(method, path, &body.to_string()).await
}

#[tokio::test]
async fn files_are_listed_read_and_changed_in_the_seeds_shapes() {
    let (server, session, folder) = with_session().await;
    std::fs::create_dir_all(folder.join("src")).unwrap();
    std::fs::write(folder.join("src/main.py"), "print('hello world')\n").unwrap();
    std::fs::write(folder.join("notes.md"), "# Notes\n").unwrap();
    std::fs::write(folder.join("photo.png"), b"\x89PNG\r\n\x1a\nfake").unwrap();
    let list = |query: &str| format!("/linglong/v1/workspace/list?session_id={session}&{query}");
    let (status, page) = server.get(&list("path=")).await;
    assert_eq!(status, 200, "{page}");
    let names: Vec<&str> = page["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["src", "notes.md", "photo.png"], "{page}");
    assert_eq!(page["total"], 3);
    assert_eq!(page["has_more"], false);
    let src = &page["files"][0];
    assert_eq!(
        (src["is_dir"].as_bool(), src["path"].as_str()),
        (Some(true), Some("src"))
    );
    assert_eq!(page["files"][2]["is_image"], true);
    assert_eq!(page["files"][1]["is_text"], true);
    assert!(page["files"][1]["modified"].as_u64().unwrap() > 1_700_000_000_000);
    // Pages and the name filter.
    let (_, first) = server.get(&list("path=.&page=1&page_size=2")).await;
    assert_eq!(
        (
            first["files"].as_array().unwrap().len(),
            first["has_more"].as_bool()
        ),
        (2, Some(true))
    );
    let (_, filtered) = server.get(&list("path=&name_filter=NOTE")).await;
    assert_eq!(filtered["files"][0]["name"], "notes.md");
    assert_eq!(filtered["total"], 1);
    let (_, inner) = server.get(&list("path=src")).await;
    assert_eq!(inner["files"][0]["path"], "src/main.py");
    assert_eq!(inner["files"][0]["size"], 21);

    // Content, whole and by range; download names the file.
    let content = format!("/linglong/v1/workspace/content?session_id={session}&path=src/main.py");
    let whole = get_raw(&server, &content, None).await;
    assert_eq!(whole.status().as_u16(), 200);
    assert_eq!(whole.headers()["accept-ranges"], "bytes");
    assert_eq!(whole.text().await.unwrap(), "print('hello world')\n");
    let part = get_raw(&server, &content, Some("bytes=7-11")).await;
    assert_eq!(part.status().as_u16(), 206);
    assert_eq!(part.headers()["content-range"], "bytes 7-11/21");
    assert_eq!(part.text().await.unwrap(), "hello");
    let tail = get_raw(&server, &content, Some("bytes=-6")).await;
    assert_eq!(tail.text().await.unwrap(), "rld')\n");
    let beyond = get_raw(&server, &content, Some("bytes=100-200")).await;
    assert_eq!(beyond.status().as_u16(), 416);
    assert_eq!(beyond.headers()["content-range"], "bytes */21");
    let download = get_raw(
        &server,
        &format!("/linglong/v1/workspace/download?session_id={session}&path=notes.md"),
        None,
    )
    .await;
    assert_eq!(download.status().as_u16(), 200);
    assert!(
        download.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment; filename=\"notes.md\"")
    );

    // Folder, rename, duplicate (a file and a folder), delete.
    let (status, made) = server
        .post(
            "/linglong/v1/workspace/mkdir",
            json!({"session_id": session, "parent_path": "src", "name": "lib"}),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(
        (made["path"].as_str(), made["is_dir"].as_bool()),
        (Some("src/lib"), Some(true))
    );
    assert!(folder.join("src/lib").is_dir());
    let (status, renamed) = server
        .post(
            "/linglong/v1/workspace/rename",
            json!({"session_id": session, "path": "notes.md", "new_name": "README.md"}),
        )
        .await;
    assert_eq!(status, 200, "{renamed}");
    assert_eq!(renamed["path"], "README.md");
    assert!(folder.join("README.md").is_file() && !folder.join("notes.md").exists());
    let (status, copy) = server
        .post(
            "/linglong/v1/workspace/duplicate",
            json!({"session_id": session, "path": "README.md"}),
        )
        .await;
    assert_eq!(status, 200, "{copy}");
    assert_eq!(copy["name"], "README (1).md");
    assert_eq!(
        std::fs::read(folder.join("README (1).md")).unwrap(),
        b"# Notes\n"
    );
    let (status, copy) = server
        .post(
            "/linglong/v1/workspace/duplicate",
            json!({"session_id": session, "path": "src"}),
        )
        .await;
    assert_eq!(status, 200, "{copy}");
    assert_eq!(copy["name"], "src (1)");
    assert_eq!(
        std::fs::read_to_string(folder.join("src (1)/main.py")).unwrap(),
        "print('hello world')\n"
    );
    let (status, body) = send(
        &server,
        reqwest::Method::DELETE,
        "/linglong/v1/workspace/delete",
        json!({"session_id": session, "path": "src (1)"}),
    )
    .await;
    assert_eq!(
        (status, body),
        (200, json!({"status": "deleted", "path": "src (1)"}))
    );
    assert!(!folder.join("src (1)").exists());
}

#[tokio::test]
async fn paths_never_leave_the_workspace() {
    let (server, session, folder) = with_session().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "host secret").unwrap();
    std::os::unix::fs::symlink(outside.path(), folder.join("escape")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        folder.join("secret-link"),
    )
    .unwrap();
    std::fs::write(folder.join("a.txt"), "a").unwrap();
    std::fs::write(folder.join("b.txt"), "b").unwrap();
    for path in [
        "../../../etc/passwd",
        "/etc/passwd",
        "escape/secret.txt",
        "secret-link",
        "a.txt%00",
    ] {
        let response = get_raw(
            &server,
            &format!("/linglong/v1/workspace/content?session_id={session}&path={path}"),
            None,
        )
        .await;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert!((400..500).contains(&status), "{path}: {status} {text}");
        assert!(!text.contains("host secret"), "{path}");
    }
    let (status, _) = server
        .get(&format!(
            "/linglong/v1/workspace/list?session_id={session}&path=escape"
        ))
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .get(&format!(
            "/linglong/v1/workspace/list?session_id={session}&path=&restrict=0"
        ))
        .await;
    assert_eq!(status, 400);
    // A link is listed as a link and deleted as itself; what it points to stays.
    let (_, page) = server
        .get(&format!(
            "/linglong/v1/workspace/list?session_id={session}&path="
        ))
        .await;
    let link = page["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "escape")
        .unwrap();
    assert_eq!(
        (link["is_symlink"].as_bool(), link["is_dir"].as_bool()),
        (Some(true), Some(false))
    );
    let (status, _) = send(
        &server,
        reqwest::Method::DELETE,
        "/linglong/v1/workspace/delete",
        json!({"session_id": session, "path": "escape"}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(outside.path().join("secret.txt").exists());
    assert!(!folder.join("escape").exists());
    // Names are one component; a rename never replaces; the root stays.
    for (body, status) in [
        (
            json!({"session_id": session, "path": "a.txt", "new_name": "../x"}),
            400,
        ),
        (
            json!({"session_id": session, "path": "a.txt", "new_name": "b.txt"}),
            409,
        ),
        (
            json!({"session_id": session, "path": "", "new_name": "x"}),
            400,
        ),
        (
            json!({"session_id": session, "path": "nope.txt", "new_name": "x"}),
            404,
        ),
    ] {
        let (got, answer) = server
            .post("/linglong/v1/workspace/rename", body.clone())
            .await;
        assert_eq!(got, status, "{body} → {answer}");
        assert!(answer["error"].is_string());
    }
    assert_eq!(std::fs::read_to_string(folder.join("b.txt")).unwrap(), "b");
    let (status, _) = send(
        &server,
        reqwest::Method::DELETE,
        "/linglong/v1/workspace/delete",
        json!({"session_id": session, "path": "."}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(folder.join("a.txt").exists());
    // Another session's id that does not exist: 404.
    let (status, _) = server
        .get("/linglong/v1/workspace/list?session_id=0190a9a8-0000-7000-8000-000000000000&path=")
        .await;
    assert_eq!(status, 404);
}

/// Sends `bytes` as chunk `n`.
async fn put_chunk(server: &Server, id: &str, n: u64, bytes: Vec<u8>) -> (u16, Value) {
    let response = server
        .http
        .put(format!(
            "{}/linglong/v1/workspace/upload/{id}/chunk/{n}",
            server.url
        ))
        .body(bytes)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_50_mb_upload_interrupted_twice_resumes_and_appears_whole() {
    let (server, session, folder) = with_session().await;
    let size: usize = 50 * 1000 * 1000;
    let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let (status, plan) = server
        .post(
            "/linglong/v1/workspace/upload/init",
            json!({"workspace_id": session, "file_name": "big.bin", "file_size": size,
                   "target_path": "big.bin", "target_dir_path": "data"}),
        )
        .await;
    assert_eq!(status, 200, "{plan}");
    let id = plan["upload_id"].as_str().unwrap().to_owned();
    let chunks = plan["chunks"].as_array().unwrap().clone();
    assert_eq!(plan["chunk_count"].as_u64().unwrap() as usize, chunks.len());
    assert!(chunks.len() >= 5, "{plan}");
    let slice = |chunk: &Value| {
        let offset = chunk["offset"].as_u64().unwrap() as usize;
        let len = chunk["size"].as_u64().unwrap() as usize;
        data[offset..offset + len].to_vec()
    };
    // The first chunks arrive, in any order.
    for n in [1, 0, 2] {
        let (status, body) = put_chunk(&server, &id, n, slice(&chunks[n as usize])).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "uploaded");
    }
    // Interrupted once: half a chunk, then the connection ends.
    let half = slice(&chunks[3])[..1000].to_vec();
    let (status, _) = put_chunk(&server, &id, 3, half).await;
    assert_eq!(status, 400);
    // Interrupted again: the body fails mid-way.
    let third = slice(&chunks[4]);
    let failing = futures::stream::iter(vec![
        Ok::<_, std::io::Error>(third[..4096].to_vec()),
        Err(std::io::Error::other("the network went away")),
    ]);
    let interrupted = server
        .http
        .put(format!(
            "{}/linglong/v1/workspace/upload/{id}/chunk/4",
            server.url
        ))
        .body(reqwest::Body::wrap_stream(failing))
        .send()
        .await;
    if let Ok(response) = interrupted {
        assert_ne!(response.status().as_u16(), 200);
    }
    // Nothing of the file is visible yet; the upload knows what is missing.
    assert!(!folder.join("data/big.bin").exists());
    let (status, state) = server
        .get(&format!("/linglong/v1/workspace/upload/{id}"))
        .await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["received"], json!([0, 1, 2]));
    let missing: Vec<u64> = state["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    let (status, early) = server
        .post(
            &format!("/linglong/v1/workspace/upload/{id}/complete"),
            json!({}),
        )
        .await;
    assert_eq!(status, 409, "{early}");
    // Resumed: the missing chunks, then complete.
    for n in missing {
        let (status, body) = put_chunk(&server, &id, n, slice(&chunks[n as usize])).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, done) = server
        .post(
            &format!("/linglong/v1/workspace/upload/{id}/complete"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "completed");
    assert_eq!(done["path"], "data/big.bin");
    let written = std::fs::read(folder.join("data/big.bin")).unwrap();
    assert_eq!(written.len(), size);
    assert_eq!(sha2::Sha256::digest(&written), sha2::Sha256::digest(&data));
    // No temporary file is left beside it, and the upload is gone.
    let names: Vec<String> = std::fs::read_dir(folder.join("data"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["big.bin"]);
    let (status, _) = server
        .get(&format!("/linglong/v1/workspace/upload/{id}"))
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn uploads_past_the_limits_or_with_bad_chunks_are_refused() {
    let (server, session, _folder) = with_session().await;
    let init = |size: u64, target: &str| json!({"workspace_id": session, "file_name": "f", "file_size": size, "target_path": target});
    let (status, body) = server
        .post(
            "/linglong/v1/workspace/upload/init",
            init(1 << 40, "huge.bin"),
        )
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error_code"], "UPLOAD_TOO_LARGE");
    for target in ["../x", "/etc/x", ""] {
        let (status, body) = server
            .post("/linglong/v1/workspace/upload/init", init(10, target))
            .await;
        assert_eq!(status, 400, "{target}: {body}");
    }
    let (_, plan) = server
        .post("/linglong/v1/workspace/upload/init", init(10, "small.txt"))
        .await;
    let id = plan["upload_id"].as_str().unwrap().to_owned();
    let (status, _) = put_chunk(&server, &id, 0, vec![b'x'; 11]).await;
    assert_eq!(status, 400);
    let (status, _) = put_chunk(&server, &id, 1, vec![b'x'; 10]).await;
    assert_eq!(status, 404);
    let (status, _) = put_chunk(
        &server,
        "0123456789abcdef0123456789abcdef",
        0,
        vec![b'x'; 10],
    )
    .await;
    assert_eq!(status, 404);
    let (status, body) = send(
        &server,
        reqwest::Method::DELETE,
        &format!("/linglong/v1/workspace/upload/{id}"),
        json!({}),
    )
    .await;
    assert_eq!(
        (status, body),
        (200, json!({"upload_id": id, "status": "cancelled"}))
    );
    let (status, _) = put_chunk(&server, &id, 0, vec![b'x'; 10]).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_folder_downloads_as_a_zip_equal_to_it() {
    let (server, session, folder) = with_session().await;
    std::fs::create_dir_all(folder.join("project/src/deep")).unwrap();
    std::fs::create_dir_all(folder.join("project/empty")).unwrap();
    std::fs::write(folder.join("project/README.md"), "# Project\n").unwrap();
    std::fs::write(folder.join("project/src/main.rs"), "fn main() {}\n").unwrap();
    let big: Vec<u8> = (0..300_000).map(|i: u32| (i % 253) as u8).collect();
    std::fs::write(folder.join("project/src/deep/data.bin"), &big).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", folder.join("project/link")).unwrap();
    let response = get_raw(
        &server,
        &format!("/linglong/v1/workspace/download?session_id={session}&path=project"),
        None,
    )
    .await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "application/zip");
    assert!(
        response.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains("project.zip")
    );
    let archive = response.bytes().await.unwrap();
    // Read back by Python's zipfile: every name with its bytes' SHA-256.
    let mut reader = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import hashlib, io, json, sys, zipfile\n\
             z = zipfile.ZipFile(io.BytesIO(sys.stdin.buffer.read()))\n\
             assert z.testzip() is None\n\
             print(json.dumps({i.filename: hashlib.sha256(z.read(i)).hexdigest() for i in z.infolist()}))",
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = reader.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, &archive)
        .await
        .unwrap();
    drop(stdin);
    let output = reader.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed: Value = serde_json::from_slice(&output.stdout).unwrap();
    let sha = |bytes: &[u8]| format!("{:x}", sha2::Sha256::digest(bytes));
    assert_eq!(
        listed,
        json!({
            "README.md": sha(b"# Project\n"),
            "empty/": sha(b""),
            "src/": sha(b""),
            "src/deep/": sha(b""),
            "src/deep/data.bin": sha(&big),
            "src/main.rs": sha(b"fn main() {}\n"),
        }),
        "the link is left out, everything else is there"
    );
}

#[tokio::test]
async fn search_respects_gitignore_and_is_capped() {
    let (server, session, folder) = with_session().await;
    std::fs::create_dir_all(folder.join("src")).unwrap();
    std::fs::create_dir_all(folder.join("build")).unwrap();
    std::fs::write(folder.join(".gitignore"), "build/\n").unwrap();
    std::fs::write(folder.join("src/alpha.py"), "needle and thread\n").unwrap();
    std::fs::write(folder.join("src/beta.py"), "only thread\n").unwrap();
    std::fs::write(folder.join("build/alpha.py"), "needle and thread\n").unwrap();
    std::fs::write(folder.join("src/blob.bin"), b"needle\0binary").unwrap();
    let search =
        |query: &str| format!("/linglong/v1/workspace/search?session_id={session}&path=&{query}");
    let paths = |found: &Value| -> Vec<String> {
        let mut paths: Vec<String> = found
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap().to_owned())
            .collect();
        paths.sort();
        paths
    };
    let (status, found) = server.get(&search("query=needle")).await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(paths(&found), ["src/alpha.py"]);
    let (_, found) = server.get(&search("query=needle%20thread")).await;
    assert_eq!(paths(&found), ["src/alpha.py"]);
    let (_, found) = server.get(&search("query=needle%7Conly")).await;
    assert_eq!(paths(&found), ["src/alpha.py", "src/beta.py"]);
    let (_, found) = server.get(&search("name_filter=BETA")).await;
    assert_eq!(paths(&found), ["src/beta.py"]);
    let (status, _) = server.get(&search("")).await;
    assert_eq!(status, 400);
    std::fs::create_dir_all(folder.join("many")).unwrap();
    for n in 0..600 {
        std::fs::write(folder.join(format!("many/f{n}.txt")), "x").unwrap();
    }
    let (_, found) = server.get(&search("name_filter=.txt")).await;
    assert_eq!(found.as_array().unwrap().len(), 500);
}

/// tus 1.0 through a real client (`tuspy` from PyPI, with checksums): a 50 MB upload stopped
/// twice and resumed by new uploaders from the server's offset.
#[tokio::test]
async fn a_tus_client_uploads_resumes_and_the_file_appears_whole() {
    let (server, session, folder) = with_session().await;
    let source = tempfile::tempdir().unwrap();
    let size: usize = 50 * 1000 * 1000;
    let data: Vec<u8> = (0..size).map(|i| (i * 7 % 241) as u8).collect();
    std::fs::write(source.path().join("big.bin"), &data).unwrap();
    let script = r#"
import json, sys
from tusclient import client
url, session, path = sys.argv[1:4]
tus = client.TusClient(url)
meta = {"session_id": session, "target_path": "uploads/big.bin"}
first = tus.uploader(path, chunk_size=4_000_000, metadata=meta, upload_checksum=True)
first.upload(stop_at=12_000_000)
second = tus.uploader(path, chunk_size=4_000_000, url=first.url, upload_checksum=True)
resumed_once = second.offset
second.upload(stop_at=28_000_000)
third = tus.uploader(path, chunk_size=4_000_000, url=first.url, upload_checksum=True)
resumed_twice = third.offset
third.upload()
print(json.dumps({"url": first.url, "resumed": [resumed_once, resumed_twice], "offset": third.offset}))
"#;
    let python = super::support::mcp_servers().python();
    let output = tokio::process::Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(format!("{}/linglong/v1/workspace/tus", server.url))
        .arg(&session)
        .arg(source.path().join("big.bin"))
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report["resumed"],
        json!([12_000_000, 28_000_000]),
        "{report}"
    );
    assert_eq!(report["offset"], size);
    let written = std::fs::read(folder.join("uploads/big.bin")).unwrap();
    assert_eq!(written.len(), size);
    assert_eq!(sha2::Sha256::digest(&written), sha2::Sha256::digest(&data));
    // The finished upload still answers its offset.
    let url = report["url"].as_str().unwrap().to_owned();
    let head = server
        .http
        .head(&url)
        .header("tus-resumable", "1.0.0")
        .send()
        .await
        .unwrap();
    assert_eq!(head.status().as_u16(), 200);
    assert_eq!(head.headers()["upload-offset"], size.to_string().as_str());
}

/// Creates a tus upload of `length` bytes to `target` in `session`'s workspace.
async fn tus_create(
    server: &Server,
    session: &str,
    length: u64,
    target: &str,
) -> reqwest::Response {
    use base64::Engine as _;
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    server
        .http
        .post(format!("{}/linglong/v1/workspace/tus", server.url))
        .header("tus-resumable", "1.0.0")
        .header("upload-length", length.to_string())
        .header(
            "upload-metadata",
            format!("session_id {},target_path {}", b64(session), b64(target)),
        )
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn tus_speaks_the_protocol_and_refuses_what_it_must() {
    let (server, session, folder) = with_session().await;
    let base = format!("{}/linglong/v1/workspace/tus", server.url);
    let discovered = server
        .http
        .request(reqwest::Method::OPTIONS, &base)
        .send()
        .await
        .unwrap();
    assert_eq!(discovered.status().as_u16(), 204, "{discovered:?}");
    assert_eq!(
        discovered.headers()["tus-version"],
        "1.0.0",
        "{discovered:?}"
    );
    assert_eq!(
        discovered.headers()["tus-extension"],
        "creation,termination,checksum"
    );
    // No version: 412.
    let refused = server
        .http
        .post(&base)
        .header("upload-length", "5")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 412);
    let created = tus_create(&server, &session, 10, "t.txt").await;
    assert_eq!(created.status().as_u16(), 201);
    assert_eq!(created.headers()["tus-resumable"], "1.0.0");
    let location = created.headers()["location"].to_str().unwrap().to_owned();
    let url = format!("{}{location}", server.url);
    let patch = |offset: u64, body: &'static [u8], checksum: Option<String>| {
        let mut request = server
            .http
            .patch(&url)
            .header("tus-resumable", "1.0.0")
            .header("content-type", "application/offset+octet-stream")
            .header("upload-offset", offset.to_string())
            .body(body);
        if let Some(checksum) = checksum {
            request = request.header("upload-checksum", checksum);
        }
        request.send()
    };
    let response = patch(
        0,
        b"hello",
        Some("sha1 AAAAAAAAAAAAAAAAAAAAAAAAAAA=".into()),
    )
    .await
    .unwrap();
    assert_eq!(response.status().as_u16(), 460, "a wrong checksum");
    let sha1 = {
        use base64::Engine as _;
        use sha1::Digest as _;
        base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(b"hello"))
    };
    let response = patch(0, b"hello", Some(format!("sha1 {sha1}")))
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    assert_eq!(response.headers()["upload-offset"], "5");
    let response = patch(0, b"again", None).await.unwrap();
    assert_eq!(response.status().as_u16(), 409, "a stale offset");
    assert!(
        !folder.join("t.txt").exists(),
        "nothing visible before the end"
    );
    let response = patch(5, b"world", None).await.unwrap();
    assert_eq!(response.status().as_u16(), 204);
    assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"helloworld");
    // Termination, and an upload past the workspace.
    let response = server
        .http
        .delete(&url)
        .header("tus-resumable", "1.0.0")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    let gone = server
        .http
        .head(&url)
        .header("tus-resumable", "1.0.0")
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status().as_u16(), 404);
    let outside = tus_create(&server, &session, 1, "../x").await;
    assert_eq!(outside.status().as_u16(), 400);
}

#[tokio::test]
async fn the_folder_picker_lists_folders_inside_the_workspace_only() {
    let (server, session, folder) = with_session().await;
    for dir in ["src/lib", "docs", ".git"] {
        std::fs::create_dir_all(folder.join(dir)).unwrap();
    }
    std::fs::write(folder.join("README.md"), "x").unwrap();
    std::os::unix::fs::symlink("/etc", folder.join("etc-link")).unwrap();
    let (status, children) = server
        .get(&format!(
            "/linglong/v1/workspace/children?session_id={session}&path="
        ))
        .await;
    assert_eq!(status, 200, "{children}");
    assert_eq!(
        children,
        json!([{"name": "docs", "path": "docs"}, {"name": "src", "path": "src"}])
    );
    let (status, tree) = server
        .get(&format!(
            "/linglong/v1/workspace/tree?session_id={session}&path=src"
        ))
        .await;
    assert_eq!(status, 200, "{tree}");
    assert_eq!(
        tree,
        json!([{"name": "src", "path": "src", "is_root": true,
                "children": [{"name": "lib", "path": "src/lib", "is_root": false}]}])
    );
    for path in ["/", "..", "etc-link"] {
        let (status, _) = server
            .get(&format!(
                "/linglong/v1/workspace/children?session_id={session}&path={path}"
            ))
            .await;
        assert_eq!(status, 400, "{path}");
    }
}

#[tokio::test]
async fn entries_move_and_copy_each_on_its_own() {
    let (server, session, folder) = with_session().await;
    std::fs::create_dir_all(folder.join("in/sub")).unwrap();
    std::fs::create_dir_all(folder.join("out")).unwrap();
    std::fs::write(folder.join("in/a.txt"), "a").unwrap();
    std::fs::write(folder.join("in/sub/b.txt"), "b").unwrap();
    std::fs::write(folder.join("out/a.txt"), "old").unwrap();
    let (status, moved) = server
        .post(
            "/linglong/v1/workspace/move",
            json!({"session_id": session, "paths": ["in/a.txt", "in/sub", "in/none"], "dest_dir": "out"}),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["moved"][0]["path"], "out/sub");
    let errors = moved["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{moved}");
    assert_eq!(errors[0]["path"], "in/a.txt");
    assert_eq!(errors[0]["conflict"], true);
    assert!(folder.join("out/sub/b.txt").is_file() && !folder.join("in/sub").exists());
    assert_eq!(
        std::fs::read_to_string(folder.join("out/a.txt")).unwrap(),
        "old"
    );
    let (status, moved) = server
        .post(
            "/linglong/v1/workspace/move",
            json!({"session_id": session, "paths": ["in/a.txt"], "dest_dir": "out", "overwrite": true}),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["errors"], json!([]));
    assert_eq!(
        std::fs::read_to_string(folder.join("out/a.txt")).unwrap(),
        "a"
    );
    let (status, copied) = server
        .post(
            "/linglong/v1/workspace/copy",
            json!({"session_id": session, "paths": ["out/sub"], "dest_dir": "in"}),
        )
        .await;
    assert_eq!(status, 200, "{copied}");
    assert_eq!(copied["copied"][0]["path"], "in/sub");
    assert_eq!(
        std::fs::read_to_string(folder.join("in/sub/b.txt")).unwrap(),
        "b"
    );
    assert!(folder.join("out/sub/b.txt").is_file());
    // A folder into itself, a destination that is not a folder, paths out.
    let (_, into) = server
        .post(
            "/linglong/v1/workspace/move",
            json!({"session_id": session, "paths": ["out"], "dest_dir": "out/sub"}),
        )
        .await;
    assert_eq!(into["errors"].as_array().unwrap().len(), 1, "{into}");
    for body in [
        json!({"session_id": session, "paths": ["in/sub"], "dest_dir": "out/a.txt"}),
        json!({"session_id": session, "paths": ["in/sub"], "dest_dir": "../.."}),
        json!({"session_id": session, "paths": [], "dest_dir": "out"}),
    ] {
        let (status, answer) = server
            .post("/linglong/v1/workspace/move", body.clone())
            .await;
        assert_eq!(status, 400, "{body} → {answer}");
    }
}

/// Two PATCHes of one tus upload at once: the second is refused while the first goes on.
#[tokio::test]
async fn one_tus_patch_at_a_time() {
    let (server, session, folder) = with_session().await;
    let created = tus_create(&server, &session, 8, "two.txt").await;
    let location = created.headers()["location"].to_str().unwrap().to_owned();
    let url = format!("{}{location}", server.url);
    let id = location.rsplit('/').next().unwrap().to_owned();
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|piece| (piece, receiver))
    });
    let first = {
        let request = server
            .http
            .patch(&url)
            .header("tus-resumable", "1.0.0")
            .header("content-type", "application/offset+octet-stream")
            .header("upload-offset", "0")
            .body(reqwest::Body::wrap_stream(body));
        tokio::spawn(request.send())
    };
    sender.send(Ok(b"fire".to_vec())).await.unwrap();
    let lock = folder
        .parent()
        .unwrap()
        .join(".uploads")
        .join(&id)
        .join("patch.lock");
    for _ in 0..100 {
        if lock.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(lock.exists(), "the first PATCH holds the lock");
    let second = server
        .http
        .patch(&url)
        .header("tus-resumable", "1.0.0")
        .header("content-type", "application/offset+octet-stream")
        .header("upload-offset", "0")
        .body("fire")
        .send()
        .await
        .unwrap();
    assert_eq!(second.status().as_u16(), 409);
    sender.send(Ok(b"wood".to_vec())).await.unwrap();
    drop(sender);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status().as_u16(), 204);
    assert_eq!(first.headers()["upload-offset"], "8");
    assert_eq!(std::fs::read(folder.join("two.txt")).unwrap(), b"firewood");
    assert!(!lock.exists());
}

#[tokio::test]
async fn thumbnails_are_scaled_images_cached_until_the_file_changes() {
    let (server, session, folder) = with_session().await;
    // A wide transparent PNG and an opaque JPEG.
    let png = image::RgbaImage::from_fn(600, 300, |x, _| image::Rgba([(x % 256) as u8, 0, 0, 128]));
    png.save(folder.join("wide.png")).unwrap();
    let jpeg = image::RgbImage::from_fn(500, 1000, |_, y| image::Rgb([0, (y % 256) as u8, 0]));
    jpeg.save(folder.join("tall.jpg")).unwrap();
    std::fs::write(folder.join("notes.md"), "# Notes\n").unwrap();
    let url = |path: &str, extra: &str| {
        format!("/linglong/v1/workspace/thumbnail?session_id={session}&path={path}{extra}")
    };

    let response = get_raw(&server, &url("wide.png", ""), None).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "image/png");
    let etag = response.headers()["etag"].to_str().unwrap().to_owned();
    let made = image::load_from_memory(&response.bytes().await.unwrap()).unwrap();
    assert_eq!((made.width(), made.height()), (256, 128));
    assert!(made.color().has_alpha());

    let response = get_raw(&server, &url("tall.jpg", "&size=100"), None).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "image/jpeg");
    let made = image::load_from_memory(&response.bytes().await.unwrap()).unwrap();
    assert_eq!((made.width(), made.height()), (50, 100));

    // Asked again with its ETag: not made again; once the file changes, made anew.
    let again = server
        .http
        .get(format!("{}{}", server.url, url("wide.png", "")))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    image::RgbaImage::from_pixel(40, 20, image::Rgba([0, 0, 255, 255]))
        .save(folder.join("wide.png"))
        .unwrap();
    let changed = server
        .http
        .get(format!("{}{}", server.url, url("wide.png", "")))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(changed.status(), 200);
    let made = image::load_from_memory(&changed.bytes().await.unwrap()).unwrap();
    // Never enlarged.
    assert_eq!((made.width(), made.height()), (40, 20));

    // Not an image, a size out of range, a path out of the workspace: refused.
    for (path, extra, status) in [
        ("notes.md", "", 400),
        ("wide.png", "&size=5", 400),
        ("wide.png", "&size=5000", 400),
        ("../wide.png", "", 400),
        ("missing.png", "", 404),
    ] {
        let response = get_raw(&server, &url(path, extra), None).await;
        assert_eq!(response.status(), status, "{path}{extra}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].is_string(), "{body}");
    }
}

#[tokio::test]
async fn pasted_files_go_to_the_paste_folder_and_are_named_in_messages() {
    let (server, session, folder) = with_session().await;
    let (status, body) = server.get("/linglong/v1/workspace/paste-dir").await;
    assert_eq!((status, &body), (200, &json!({"path": "pasted"})));
    let pixel = image_bytes();
    let target = format!("{}/shot.png", body["path"].as_str().unwrap());
    let (status, plan) = server
        .post(
            "/linglong/v1/workspace/upload/init",
            json!({"session_id": session, "file_name": "shot.png", "file_size": pixel.len(), "target_path": target}),
        )
        .await;
    assert_eq!(status, 200, "{plan}");
    let id = plan["upload_id"].as_str().unwrap().to_owned();
    let (status, _) = put_chunk(&server, &id, 0, pixel.clone()).await;
    assert_eq!(status, 200);
    let (status, done) = server
        .post(
            &format!("/linglong/v1/workspace/upload/{id}/complete"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        std::fs::read(folder.join("pasted/shot.png")).unwrap(),
        pixel
    );
    // The message names it, as the seed's console does: the model gets the picture.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("A red dot.")));
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "session_id": session, "text": "What is <file>pasted/shot.png</file>?"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let sent = server.mock.requests().last().unwrap().body.to_string();
    assert!(sent.contains("data:image/png;base64,"), "{sent}");
}

/// A 1×1 PNG.
fn image_bytes() -> Vec<u8> {
    let mut bytes = std::io::Cursor::new(Vec::new());
    image::RgbImage::from_pixel(1, 1, image::Rgb([255, 0, 0]))
        .write_to(&mut bytes, image::ImageFormat::Png)
        .unwrap();
    bytes.into_inner()
}

/// An agent whose sessions share one workspace: what a run of one session writes (with the
/// file tools, and with a command in the sandbox) a run of another session and a stateless run
/// find; the file routes reach it by `agent_id` (uploads too) and by any of its sessions.
#[tokio::test]
async fn an_agents_sessions_share_its_workspace() {
    let server = super::support::start_with_workspaces().await;
    let agent = json!({"id": "scribe", "model_id": "mock", "workspace": "agent",
                       "tool_ids": ["write_file", "exec"]});
    let (status, body) = server.post("/v1/agents", agent).await;
    assert_eq!(status, 201, "{body}");
    let (_, body) = server.get("/v1/agents/scribe").await;
    assert_eq!(body["workspace"], "agent", "{body}");

    // A run in a new session writes a file.
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "write_file",
        json!({"path": "notes.txt", "content": "from the first session\n"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("written")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "scribe", "text": "write", "session_id": "new"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let first = body["session_id"].as_str().unwrap().to_owned();

    // A run in another session finds it, in the sandbox too.
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "exec",
        json!({"command": "cp notes.txt copy.txt"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("copied")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "scribe", "text": "copy", "session_id": "new"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let second = body["session_id"].as_str().unwrap().to_owned();
    assert_ne!(first, second);
    let shared = server
        .state
        .app
        .parts()
        .sessions
        .shared_workspace("scribe")
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(shared.join("copy.txt")).unwrap(),
        "from the first session\n"
    );

    // A stateless run of the agent works there as well.
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "write_file",
        json!({"path": "stateless.txt", "content": "no session\n"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("done")));
    let (status, body) = server
        .post("/v1/infer", json!({"agent_id": "scribe", "text": "again"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(shared.join("stateless.txt").is_file());

    // The file routes: by agent, and by each session, the same folder.
    let names = |listing: &Value| -> Vec<String> {
        let mut names: Vec<String> = listing["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    };
    let expected = vec!["copy.txt", "notes.txt", "stateless.txt"];
    for query in [
        "agent_id=scribe".to_owned(),
        format!("session_id={first}"),
        format!("session_id={second}"),
    ] {
        let (status, listing) = server
            .get(&format!("/linglong/v1/workspace/list?{query}"))
            .await;
        assert_eq!(status, 200, "{query}: {listing}");
        assert_eq!(names(&listing), expected, "{query}");
    }
    // An upload by agent lands in the shared folder.
    let (status, plan) = send(
        &server,
        reqwest::Method::POST,
        "/linglong/v1/workspace/upload/init",
        json!({"agent_id": "scribe", "file_name": "up.bin", "file_size": 3, "target_path": "up.bin"}),
    )
    .await;
    assert_eq!(status, 200, "{plan}");
    let id = plan["upload_id"].as_str().unwrap();
    let response = server
        .http
        .put(format!(
            "{}/linglong/v1/workspace/upload/{id}/chunk/0",
            server.url
        ))
        .body(b"abc".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (status, body) = send(
        &server,
        reqwest::Method::POST,
        &format!("/linglong/v1/workspace/upload/{id}/complete"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(std::fs::read(shared.join("up.bin")).unwrap(), b"abc");
    let (status, body) = server
        .get(&format!(
            "/linglong/v1/workspace/content?session_id={first}&path=up.bin"
        ))
        .await;
    assert_eq!((status, body), (200, json!("abc")));

    // Bad references: both, neither, an unknown agent, an agent without a shared workspace.
    let (status, body) = server
        .get(&format!(
            "/linglong/v1/workspace/list?agent_id=scribe&session_id={first}"
        ))
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = server.get("/linglong/v1/workspace/list?path=").await;
    assert_eq!(status, 400);
    let (status, _) = server
        .get("/linglong/v1/workspace/list?agent_id=nobody")
        .await;
    assert_eq!(status, 404);
    let (status, _) = server
        .post("/v1/agents", json!({"id": "plain", "model_id": "mock"}))
        .await;
    assert_eq!(status, 201);
    let (status, body) = server
        .get("/linglong/v1/workspace/list?agent_id=plain")
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "odd", "model_id": "mock", "workspace": "team"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
}

/// An agent with a shared workspace, asked by another through `talk_to`, works in its own
/// shared folder (its child session's workspace links there), not in the caller's.
#[tokio::test]
async fn an_agent_asked_by_another_works_in_its_shared_workspace() {
    let server = super::support::start_with_workspaces().await;
    for agent in [
        json!({"id": "scribe", "model_id": "mock", "workspace": "agent", "tool_ids": ["write_file"]}),
        json!({"id": "boss", "model_id": "mock", "tool_ids": ["talk_to"]}),
    ] {
        let (status, body) = server.post("/v1/agents", agent).await;
        assert_eq!(status, 201, "{body}");
    }
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "talk_to",
        json!({"agents": ["scribe"], "message": "Write it down."}),
    )));
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "write_file",
        json!({"path": "minutes.txt", "content": "noted\n"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Noted.")));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("The scribe noted it.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "boss", "text": "Minutes, please.", "session_id": "new"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "The scribe noted it.", "{body}");
    let shared = server
        .state
        .app
        .parts()
        .sessions
        .shared_workspace("scribe")
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(shared.join("minutes.txt")).unwrap(),
        "noted\n"
    );
    let boss = body["session_id"].as_str().unwrap();
    let boss_folder = server
        .state
        .app
        .parts()
        .sessions
        .workspace(boss.parse().unwrap())
        .unwrap();
    assert!(!boss_folder.join("minutes.txt").exists());
    let (_, shown) = server.get(&format!("/v1/sessions/{boss}")).await;
    let child = shown["children"][0]["session_id"].as_str().unwrap();
    let child_folder = server
        .state
        .app
        .parts()
        .sessions
        .workspace(child.parse().unwrap())
        .unwrap();
    assert_eq!(
        std::fs::canonicalize(child_folder).unwrap(),
        std::fs::canonicalize(&shared).unwrap()
    );
}

/// Files an agent or a user wrote never run as pages on the API's origin (the second security
/// review's N4): active types (HTML, SVG, XML) are read as plain text or come as attachments,
/// inert ones (raster images, plain text) stay inline, and every answer forbids sniffing and
/// sandboxes whatever is opened.
#[tokio::test]
async fn workspace_files_are_never_served_as_active_content() {
    let (server, session, folder) = with_session().await;
    let script = "<script>document.write('XSS on ' + document.domain)</script>";
    std::fs::write(folder.join("report.html"), script).unwrap();
    std::fs::write(
        folder.join("chart.svg"),
        format!("<svg xmlns=\"http://www.w3.org/2000/svg\">{script}</svg>"),
    )
    .unwrap();
    std::fs::write(folder.join("feed.xml"), "<feed/>").unwrap();
    std::fs::write(folder.join("notes.txt"), "plain").unwrap();
    std::fs::write(folder.join("dot.png"), image_bytes()).unwrap();
    // (name, content type, attachment?)
    for (name, content_type, attachment) in [
        ("report.html", "text/plain; charset=utf-8", false),
        ("feed.xml", "text/plain; charset=utf-8", false),
        ("chart.svg", "image/svg+xml", true),
        ("notes.txt", "text/plain", false),
        ("dot.png", "image/png", false),
    ] {
        let response = server
            .http
            .get(format!(
                "{}/linglong/v1/workspace/content?session_id={session}&path={name}",
                server.url
            ))
            .header("sec-fetch-mode", "navigate")
            .header("sec-fetch-dest", "document")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{name}");
        let headers = response.headers();
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with(content_type),
            "{name}: {headers:?}"
        );
        assert_eq!(headers["x-content-type-options"], "nosniff", "{name}");
        assert_eq!(
            headers["content-security-policy"], "sandbox; default-src 'none'",
            "{name}"
        );
        assert_eq!(
            headers
                .get("content-disposition")
                .is_some_and(|value| value.to_str().unwrap().starts_with("attachment")),
            attachment,
            "{name}: {headers:?}"
        );
    }
    // Downloads and thumbnails carry the same guards.
    for path in [
        format!("/linglong/v1/workspace/download?session_id={session}&path=report.html"),
        format!("/linglong/v1/workspace/thumbnail?session_id={session}&path=dot.png"),
    ] {
        let response = get_raw(&server, &path, None).await;
        assert_eq!(response.status().as_u16(), 200, "{path}");
        assert_eq!(response.headers()["x-content-type-options"], "nosniff");
        assert_eq!(
            response.headers()["content-security-policy"],
            "sandbox; default-src 'none'"
        );
    }
}

/// Unfinished uploads count against the workspace's quota with the bytes they announced, and a
/// workspace may have only so many at once (the second security review's N5: six 4 GiB uploads
/// and three tus uploads were all accepted against a 20 GiB quota).
#[tokio::test]
async fn unfinished_uploads_count_against_the_quota_and_are_capped() {
    let (server, session, _folder) = with_session().await;
    let init = |size: u64, target: String| json!({"workspace_id": session, "file_name": "f", "file_size": size, "target_path": target});
    let four_gib: u64 = 4 << 30;
    // Five of 4 GiB fill the 20 GiB quota; a sixth, chunked or tus, is refused.
    let mut big = Vec::new();
    for n in 0..5 {
        let (status, body) = server
            .post(
                "/linglong/v1/workspace/upload/init",
                init(four_gib, format!("big{n}.bin")),
            )
            .await;
        assert_eq!(status, 200, "upload {n}: {body}");
        big.push(body["upload_id"].as_str().unwrap().to_owned());
    }
    let (status, body) = server
        .post(
            "/linglong/v1/workspace/upload/init",
            init(four_gib, "big5.bin".into()),
        )
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(body.to_string().contains("unfinished uploads"), "{body}");
    let response = tus_create(&server, &session, four_gib, "big6.bin").await;
    assert_eq!(response.status().as_u16(), 413);
    // A cancelled upload frees its bytes.
    let (status, body) = send(
        &server,
        reqwest::Method::DELETE,
        &format!("/linglong/v1/workspace/upload/{}", big[0]),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let response = tus_create(&server, &session, four_gib, "big6.bin").await;
    assert_eq!(response.status().as_u16(), 201);
    for id in &big[1..] {
        let path = format!("/linglong/v1/workspace/upload/{id}");
        let (status, body) = send(&server, reqwest::Method::DELETE, &path, json!({})).await;
        assert_eq!(status, 200, "{body}");
    }
    // Small ones up to the workspace's count of unfinished uploads (the tus one is one), then
    // 429.
    let room = agentry_app::workspace_files::MAX_PENDING_PER_WORKSPACE - 1;
    for n in 0..room {
        let (status, body) = server
            .post(
                "/linglong/v1/workspace/upload/init",
                init(10, format!("small{n}.txt")),
            )
            .await;
        assert_eq!(status, 200, "upload {n}: {body}");
    }
    let (status, body) = server
        .post(
            "/linglong/v1/workspace/upload/init",
            init(10, "one-more.txt".into()),
        )
        .await;
    assert_eq!(status, 429, "{body}");
    let response = tus_create(&server, &session, 10, "tus-more.txt").await;
    assert_eq!(response.status().as_u16(), 429);
}

/// `POST path` with `body` as `key`: the status and the JSON answer.
async fn post_as(server: &Server, key: &str, path: &str, body: Value) -> (u16, Value) {
    let response = server
        .http
        .post(format!("{}{path}", server.url))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// A new session of `key` (a run in it).
async fn session_of(server: &Server, key: &str) -> String {
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Hi.")));
    let (status, body) = post_as(
        server,
        key,
        "/linglong/v1/infer",
        json!({"model_id": "mock", "text": "Hello", "session_id": "new"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["session_id"].as_str().unwrap().to_owned()
}

/// One API key's unfinished uploads are capped across its workspaces; another key is not held
/// back by them.
#[tokio::test]
async fn a_keys_unfinished_uploads_are_capped_across_its_workspaces() {
    use agentry_app::auth::{KeyLimits, KeyRole, create_key, create_key_with};
    use agentry_app::workspace_files::{MAX_PENDING_PER_KEY, MAX_PENDING_PER_WORKSPACE};
    let (server, _, _) = with_session().await;
    create_key(&server.state.app.parts().store, "admin")
        .await
        .unwrap();
    let mut keys = Vec::new();
    for label in ["a", "b"] {
        let key = create_key_with(
            &server.state.app.parts().store,
            label,
            KeyRole::User,
            KeyLimits::default(),
        )
        .await
        .unwrap();
        keys.push(key.key);
    }
    server.state.auth.refresh();
    let init = |session: &str, n: usize| {
        json!({"workspace_id": session, "file_name": "f", "file_size": 10,
               "target_path": format!("part{n}.txt")})
    };
    let path = "/linglong/v1/workspace/upload/init";
    let mut made = 0;
    while made < MAX_PENDING_PER_KEY {
        let session = session_of(&server, &keys[0]).await;
        for _ in 0..MAX_PENDING_PER_WORKSPACE.min(MAX_PENDING_PER_KEY - made) {
            let (status, body) = post_as(&server, &keys[0], path, init(&session, made)).await;
            assert_eq!(status, 200, "upload {made}: {body}");
            made += 1;
        }
    }
    let fresh = session_of(&server, &keys[0]).await;
    let (status, body) = post_as(&server, &keys[0], path, init(&fresh, made)).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.to_string().contains("this API key has"), "{body}");
    let theirs = session_of(&server, &keys[1]).await;
    let (status, body) = post_as(&server, &keys[1], path, init(&theirs, 0)).await;
    assert_eq!(status, 200, "another key uploads: {body}");
}
