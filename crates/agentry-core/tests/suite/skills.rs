//! Skills: loading folders with SKILL.md, and disclosing them as tools.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentry_core::skill::{Skill, SkillError, load_skills};
use agentry_core::tool::{Tool, ToolContext, ToolEffect, ToolRegistry};
use agentry_types::ToolResultPart;
use serde_json::json;

const PDF_SKILL: &str = "---
name: pdf-tools
description: Extract text and tables from PDF files.
license: MIT
metadata:
  version: 2
  tags: [pdf, text]
---

# PDF tools

Run `scripts/extract.py FILE` to get the text.
";

fn write_skill(root: &Path, folder: &str, skill_md: &str) -> PathBuf {
    let dir = root.join(folder);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("SKILL.md"), skill_md).unwrap();
    dir
}

fn skill_md(name: &str, description: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\nBody of {name}.\n")
}

#[tokio::test]
async fn a_skill_loads_and_discloses_its_body_and_folder_when_called() {
    let root = tempfile::tempdir().unwrap();
    let dir = write_skill(root.path(), "pdf", PDF_SKILL);
    fs::create_dir_all(dir.join("scripts")).unwrap();
    fs::write(dir.join("scripts/extract.py"), "print('hi')\n").unwrap();
    fs::write(dir.join("reference.md"), "# Reference\n").unwrap();
    fs::create_dir_all(dir.join(".git")).unwrap();
    fs::write(dir.join(".git/HEAD"), "ref\n").unwrap();

    // A path with `..` in it is canonicalised.
    let indirect = root.path().join("pdf/scripts/../");
    let skill = Skill::load(&indirect).unwrap();
    let canonical = dir.canonicalize().unwrap();
    assert_eq!(skill.name(), "pdf-tools");
    assert_eq!(
        skill.description(),
        "Extract text and tables from PDF files."
    );
    assert_eq!(
        skill.body(),
        "# PDF tools\n\nRun `scripts/extract.py FILE` to get the text.\n"
    );
    assert_eq!(skill.dir(), canonical);
    assert_eq!(
        skill.files(),
        [
            PathBuf::from("reference.md"),
            PathBuf::from("scripts/extract.py")
        ]
    );

    // The model first sees only the summary.
    let spec = skill.spec();
    assert_eq!(spec.name, "pdf-tools");
    assert_eq!(spec.description, "Extract text and tables from PDF files.");
    assert_eq!(spec.parameters, json!({"type": "object", "properties": {}}));
    assert!(skill.idempotent());

    let mut registry = ToolRegistry::default();
    registry.register(skill).unwrap();
    let output = registry
        .invoke(
            "pdf-tools",
            json!({}),
            ToolContext::detached("c"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(
        output.effect,
        Some(ToolEffect::SetWorkingDir(canonical.clone()))
    );
    let [ToolResultPart::Text { text }] = output.content.as_slice() else {
        panic!("expected one text part: {:?}", output.content);
    };
    assert!(
        text.starts_with("# PDF tools\n\nRun `scripts/extract.py FILE` to get the text."),
        "{text}"
    );
    assert!(text.contains(&canonical.display().to_string()), "{text}");
    assert!(text.contains("- reference.md\n"), "{text}");
    assert!(text.contains("- scripts/extract.py\n"), "{text}");
    assert!(!text.contains(".git"), "{text}");
    assert!(!text.contains("license"), "{text}");
}

#[test]
fn a_skill_without_other_files_says_so() {
    let root = tempfile::tempdir().unwrap();
    let dir = write_skill(root.path(), "solo", &skill_md("solo", "Alone."));
    let skill = Skill::load(&dir).unwrap();
    assert!(skill.files().is_empty());
    assert_eq!(skill.body(), "Body of solo.\n");
    assert!(skill.disclosure().contains("no other files"));
}

/// Loads a skill whose SKILL.md is `content`, expecting an error whose message names the file.
fn load_error(content: &str) -> (SkillError, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dir = write_skill(root.path(), "broken", content);
    let skill_file = dir.canonicalize().unwrap().join("SKILL.md");
    let error = Skill::load(&dir).unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&skill_file.display().to_string()),
        "the message names the file: {error}"
    );
    (error, skill_file)
}

#[test]
fn a_folder_without_skill_md_is_a_typed_error() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("empty");
    fs::create_dir_all(&dir).unwrap();
    let error = Skill::load(&dir).unwrap_err();
    let expected = dir.canonicalize().unwrap().join("SKILL.md");
    assert!(
        matches!(&error, SkillError::MissingSkillFile { path } if *path == expected),
        "{error:?}"
    );
    assert!(error.to_string().contains(&expected.display().to_string()));

    let missing_dir = root.path().join("nowhere");
    let error = Skill::load(&missing_dir).unwrap_err();
    assert!(
        matches!(&error, SkillError::Io { path, .. } if *path == missing_dir),
        "{error:?}"
    );
}

#[test]
fn missing_or_unterminated_front_matter_is_a_typed_error() {
    for content in [
        "# Just a body\n",
        "name: x\ndescription: y\n",
        "---\nname: x\ndescription: y\n",
        "",
    ] {
        let (error, file) = load_error(content);
        assert!(
            matches!(&error, SkillError::MissingFrontMatter { path } if *path == file),
            "{content:?}: {error:?}"
        );
    }
}

#[test]
fn missing_fields_are_typed_errors() {
    let (error, _) = load_error("---\nname: lonely\n---\nBody\n");
    assert!(
        matches!(
            error,
            SkillError::MissingField {
                field: "description",
                ..
            }
        ),
        "{error:?}"
    );
    let (error, _) = load_error("---\ndescription: Nameless.\n---\nBody\n");
    assert!(
        matches!(error, SkillError::MissingField { field: "name", .. }),
        "{error:?}"
    );
    let (error, _) = load_error("---\n---\nBody\n");
    assert!(
        matches!(error, SkillError::MissingField { .. }),
        "{error:?}"
    );
    let (error, _) = load_error("---\nname: blank\ndescription: \"   \"\n---\nBody\n");
    assert!(
        matches!(
            error,
            SkillError::InvalidField {
                field: "description",
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn a_bad_name_is_a_typed_error() {
    let (error, _) = load_error(&skill_md("bad name!", "Has a bad name."));
    assert!(
        matches!(&error, SkillError::InvalidField { field: "name", reason, .. } if reason.contains("\"bad name!\"")),
        "{error:?}"
    );
}

#[test]
fn bad_yaml_is_a_typed_error() {
    let (error, _) = load_error("---\nname: [unclosed\ndescription: x\n---\nBody\n");
    assert!(matches!(error, SkillError::InvalidYaml { .. }), "{error:?}");
    let (error, _) = load_error("---\n- a list\n- not a mapping\n---\nBody\n");
    assert!(matches!(error, SkillError::InvalidYaml { .. }), "{error:?}");
}

#[test]
fn load_skills_finds_every_skill_folder_sorted_by_name() {
    let root = tempfile::tempdir().unwrap();
    write_skill(root.path(), "b-folder", &skill_md("zebra", "Last by name."));
    write_skill(
        root.path(),
        "a-folder",
        &skill_md("middle", "In the middle."),
    );
    write_skill(
        root.path(),
        "c-folder",
        &skill_md("alpha", "First by name."),
    );
    fs::create_dir_all(root.path().join("not-a-skill")).unwrap();
    fs::write(root.path().join("notes.txt"), "stray file").unwrap();

    let skills = load_skills(root.path()).unwrap();
    let names: Vec<&str> = skills.iter().map(Skill::name).collect();
    assert_eq!(names, ["alpha", "middle", "zebra"]);
    assert_eq!(
        skills[0].dir(),
        root.path().join("c-folder").canonicalize().unwrap()
    );

    assert!(load_skills(&root.path().join("absent")).is_err());
}

#[test]
fn load_skills_rejects_two_skills_with_one_name() {
    let root = tempfile::tempdir().unwrap();
    write_skill(root.path(), "one", &skill_md("same", "First."));
    write_skill(root.path(), "two", &skill_md("same", "Second."));
    let error = load_skills(root.path()).unwrap_err();
    assert!(
        matches!(&error, SkillError::DuplicateName { name, .. } if name == "same"),
        "{error:?}"
    );

    let broken = tempfile::tempdir().unwrap();
    write_skill(broken.path(), "good", &skill_md("good", "Fine."));
    write_skill(broken.path(), "bad", "no front matter");
    assert!(matches!(
        load_skills(broken.path()).unwrap_err(),
        SkillError::MissingFrontMatter { .. }
    ));
}

#[test]
fn load_within_confines_skill_folders_to_their_roots() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("skills");
    let elsewhere = base.path().join("elsewhere");
    fs::create_dir_all(&root).unwrap();
    let roots = vec![root.clone()];

    // Inside: loads, by any spelling of the path.
    let inside = write_skill(&root, "pdf", PDF_SKILL);
    assert_eq!(
        Skill::load_within(&inside, &roots).unwrap().name(),
        "pdf-tools"
    );
    let dotted = root.join("pdf/../pdf");
    assert_eq!(
        Skill::load_within(&dotted, &roots).unwrap().name(),
        "pdf-tools"
    );

    // Outside, by path, by `..`, by a symlinked folder, by a symlinked SKILL.md.
    let outside = write_skill(&elsewhere, "other", &skill_md("other", "Other."));
    let escapes = root.join("../elsewhere/other");
    let linked_dir = root.join("linked");
    std::os::unix::fs::symlink(&outside, &linked_dir).unwrap();
    let linked_file = root.join("linked-file");
    fs::create_dir_all(&linked_file).unwrap();
    std::os::unix::fs::symlink(outside.join("SKILL.md"), linked_file.join("SKILL.md")).unwrap();
    for path in [&outside, &escapes, &linked_dir, &linked_file] {
        let error = Skill::load_within(path, &roots).unwrap_err();
        assert!(
            matches!(&error, SkillError::OutsideRoots { roots: named, .. } if named == &roots),
            "{}: {error:?}",
            path.display()
        );
        let message = error.to_string();
        assert!(
            message.contains("outside the allowed skill folders")
                && message.contains(&root.display().to_string()),
            "{message}"
        );
    }
    // Plain `load` (operator-chosen folders) is not confined.
    assert_eq!(Skill::load(&linked_dir).unwrap().name(), "other");

    // No roots (or a root that does not exist): nothing loads.
    let error = Skill::load_within(&inside, &[]).unwrap_err();
    assert!(error.to_string().contains("none are configured"), "{error}");
    let missing_root = vec![base.path().join("absent")];
    assert!(matches!(
        Skill::load_within(&inside, &missing_root),
        Err(SkillError::OutsideRoots { .. })
    ));
}
