//! File-journal benchmark. Prints a table; asserts nothing.
//!
//! `cargo bench -p agentry-core --bench journal`
//!
//! The cost the per-turn file journal adds to one tool file write (a 4 KiB `write_atomic`
//! through the workspace confinement, as `write_file` does it): the write alone against the
//! same write inside a journalled round (scan before, scan after, record), in workspaces of
//! 10, 100, 1,000 and 10,000 files. The first journalled round of a session keeps a copy of
//! every file (measured on its own); later rounds read only what changed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use agentry_core::workspace::Root;
use agentry_core::workspace::journal::{FileJournal, JournalConfig};
use agentry_types::{RunId, SessionId};

const WRITES: usize = 200;

fn populate(workspace: &Path, files: usize) {
    let body = vec![b'x'; 4096];
    for i in 0..files {
        let folder = workspace.join(format!("d{}", i / 100));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join(format!("f{i}.txt")), &body).unwrap();
    }
}

fn per_write(total: Duration, writes: usize) -> f64 {
    total.as_secs_f64() * 1e6 / writes as f64
}

fn main() {
    println!("File journal: one 4 KiB tool write, alone and in a journalled round");
    println!(
        "{:>8} | {:>12} | {:>14} | {:>8} | {:>16}",
        "files", "write (µs)", "journalled (µs)", "ratio", "first round (ms)"
    );
    println!("{}", "-".repeat(70));
    for files in [10usize, 100, 1_000, 10_000] {
        let temp = tempfile::tempdir().unwrap();
        let workspace = temp.path().join("ws");
        std::fs::create_dir_all(&workspace).unwrap();
        populate(&workspace, files);
        let root = Root::open(&workspace).unwrap();
        let payload = |i: usize| format!("version {i}\n").repeat(400);

        let started = Instant::now();
        for i in 0..WRITES {
            root.write_atomic(Path::new("out.txt"), "out.txt", payload(i).as_bytes())
                .unwrap();
        }
        let alone = started.elapsed();

        let journal = FileJournal::new(temp.path().join("journal"), JournalConfig::default());
        let session = SessionId::new();
        let run = RunId::new();
        let started = Instant::now();
        let mark = journal.before_round(session, &workspace).unwrap();
        journal.after_round(session, run, mark).unwrap();
        let first = started.elapsed();

        let started = Instant::now();
        for i in 0..WRITES {
            let mark = journal.before_round(session, &workspace).unwrap();
            root.write_atomic(Path::new("out.txt"), "out.txt", payload(i).as_bytes())
                .unwrap();
            journal.after_round(session, run, mark).unwrap();
        }
        let journalled = started.elapsed();
        let (alone_us, journalled_us) = (per_write(alone, WRITES), per_write(journalled, WRITES));
        println!(
            "{:>8} | {:>12.1} | {:>14.1} | {:>7.1}× | {:>16.1}",
            files,
            alone_us,
            journalled_us,
            journalled_us / alone_us,
            first.as_secs_f64() * 1e3
        );
    }
}
