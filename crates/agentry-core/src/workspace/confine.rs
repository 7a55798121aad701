//! Opening files inside the workspace root, and nowhere else.
//!
//! On Linux every open goes through `openat2(2)` relative to a descriptor of the root with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`: the kernel resolves the whole path (each `..`,
//! each symbolic link, absolute or relative, in any component) and fails with `EXDEV` when the
//! resolution would leave the root, at the moment of the open, so a link swapped in after a
//! check gains nothing. Folders are created one component at a time with `mkdirat` relative to
//! a folder opened the same way; writes go to a temporary file created with `O_EXCL |
//! O_NOFOLLOW` beside the target and renamed over it with `renameat`.
//!
//! Elsewhere the workspace tools are not available (they say so).

use std::fs::File;

use crate::tool::ToolError;

/// Whether a write created the file or replaced one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The file did not exist.
    Created,
    /// An existing file was replaced.
    Replaced,
}

/// What a folder entry is, judged without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A folder.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// A device, FIFO or socket.
    Other,
}

/// A folder entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name.
    pub name: std::ffi::OsString,
    /// What it is.
    pub kind: EntryKind,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last modified, Unix milliseconds.
    pub modified_ms: u64,
    /// What changes whenever its content or metadata may have changed.
    pub stamp: Stamp,
}

/// What changes when a file may have changed: its inode and its modification and status-change
/// times in nanoseconds (a write in place moves them, a replacing rename changes the inode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// The inode number.
    pub inode: u64,
    /// Last modification, nanoseconds since the Unix epoch.
    pub modified_ns: i128,
    /// Last status change, nanoseconds since the Unix epoch.
    pub changed_ns: i128,
}

/// The message for a file with several hard links.
fn hard_link_refusal(display: &str, links: u64) -> ToolError {
    ToolError::Failed(format!(
        "{display} has {links} hard links; the workspace tools refuse files with more than one \
         link, since another link may live outside the workspace"
    ))
}

#[cfg(target_os = "linux")]
pub use linux::Root;

#[cfg(not(target_os = "linux"))]
pub use unsupported::Root;

#[cfg(target_os = "linux")]
mod linux {
    use std::ffi::OsString;
    use std::os::fd::OwnedFd;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};

    use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
    use rustix::io::Errno;

    use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};

    use super::{Entry, EntryKind, File, Stamp, ToolError, Written, hard_link_refusal};

    /// How every path is resolved: beneath the root, no `/proc` magic links.
    const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

    /// Distinguishes temporary files of concurrent writes.
    static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

    /// An open workspace root.
    #[derive(Debug)]
    pub struct Root {
        dir: OwnedFd,
        path: PathBuf,
        /// Who new files and folders belong to: the root folder's owner, when this process runs
        /// as root and the folder is someone else's (a sandbox's workspace belongs to the
        /// sandbox's unprivileged uid, which must be able to change what the tools write).
        owner: Option<(rustix::fs::Uid, rustix::fs::Gid)>,
    }

    impl Root {
        /// Opens the workspace root.
        pub fn open(path: &Path) -> Result<Root, ToolError> {
            let dir = rustix::fs::open(
                path,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|errno| {
                ToolError::Failed(format!("the workspace folder cannot be opened: {errno}"))
            })?;
            let owner = rustix::fs::fstat(&dir).ok().and_then(|stat| {
                let uid = rustix::fs::Uid::from_raw(stat.st_uid);
                let gid = rustix::fs::Gid::from_raw(stat.st_gid);
                (rustix::process::geteuid().is_root() && !uid.is_root()).then_some((uid, gid))
            });
            Ok(Root {
                dir,
                path: path.to_owned(),
                owner,
            })
        }

        /// The root's path on the host.
        pub fn path(&self) -> &Path {
            &self.path
        }

        /// `openat2` relative to the root, retried on `EAGAIN`/`EINTR` (a concurrent rename
        /// makes the kernel ask for a retry).
        fn resolve(&self, relative: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
            resolve_at(&self.dir, relative, flags, mode)
        }

        /// Opens a regular file for reading, refusing folders, devices, FIFOs and files with
        /// several hard links. Returns the file and its size.
        pub fn open_read(&self, relative: &Path, display: &str) -> Result<(File, u64), ToolError> {
            let fd = self
                .resolve(
                    relative,
                    OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK,
                    Mode::empty(),
                )
                .map_err(|errno| fs_error(display, errno))?;
            let stat = rustix::fs::fstat(&fd).map_err(|errno| fs_error(display, errno))?;
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => {}
                FileType::Directory => {
                    return Err(ToolError::Failed(format!(
                        "{display} is a folder, not a file (list_dir lists folders)"
                    )));
                }
                _ => {
                    return Err(ToolError::Failed(format!(
                        "{display} is not a regular file"
                    )));
                }
            }
            let links = link_count(&stat);
            if links > 1 {
                return Err(hard_link_refusal(display, links));
            }
            Ok((File::from(fd), u64::try_from(stat.st_size).unwrap_or(0)))
        }

        /// Checks that `relative` is a folder inside the workspace.
        pub fn check_dir(&self, relative: &Path, display: &str) -> Result<(), ToolError> {
            self.resolve(relative, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
                .map(drop)
                .map_err(|errno| match errno {
                    Errno::NOTDIR => ToolError::Failed(format!("{display} is not a folder")),
                    errno => fs_error(display, errno),
                })
        }

        /// Checks that `relative` exists inside the workspace (any kind of file).
        pub fn check_inside(&self, relative: &Path, display: &str) -> Result<(), ToolError> {
            self.resolve(relative, OFlags::PATH, Mode::empty())
                .map(drop)
                .map_err(|errno| fs_error(display, errno))
        }

        /// Writes `bytes` to `relative` atomically: a temporary file beside it, synced, then
        /// renamed over it. Missing parent folders are created. An existing file keeps its
        /// permissions; a symbolic link, a folder or a file with several hard links at the
        /// path is refused.
        pub fn write_atomic(
            &self,
            relative: &Path,
            display: &str,
            bytes: &[u8],
        ) -> Result<Written, ToolError> {
            let mut reader = bytes;
            self.write_atomic_from(relative, display, &mut reader, true)
                .map(|(written, _)| written)
        }

        /// The entries of the folder `relative` (not `.` and `..`), each judged without following
        /// it: a symbolic link is listed as a link, never as what it points to.
        pub fn list_dir(&self, relative: &Path, display: &str) -> Result<Vec<Entry>, ToolError> {
            let fd = self
                .resolve(relative, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .map_err(|errno| fs_error(display, errno))?;
            let dir = rustix::fs::Dir::read_from(&fd).map_err(|errno| fs_error(display, errno))?;
            let mut entries = Vec::new();
            for entry in dir {
                let entry = entry.map_err(|errno| fs_error(display, errno))?;
                let name = entry.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let Ok(stat) =
                    rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                else {
                    // Gone since the listing began.
                    continue;
                };
                entries.push(Entry::of(
                    std::ffi::OsStr::from_bytes(name).to_owned(),
                    &stat,
                ));
            }
            Ok(entries)
        }

        /// What `relative` is, judged without following a last symbolic link.
        pub fn entry(&self, relative: &Path, display: &str) -> Result<Entry, ToolError> {
            let (parent, name) = self.parent_of(relative, display)?;
            let stat = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|errno| fs_error(display, errno))?;
            Ok(Entry::of(name.to_owned(), &stat))
        }

        /// Creates the folder `relative` (its parent must exist); an existing entry is an error.
        pub fn create_dir(&self, relative: &Path, display: &str) -> Result<(), ToolError> {
            let (parent, name) = self.parent_of(relative, display)?;
            rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)).map_err(|errno| {
                match errno {
                    Errno::EXIST => ToolError::Failed(format!("{display} already exists")),
                    errno => fs_error(display, errno),
                }
            })?;
            self.chown_at(&parent, name, display)
        }

        /// Renames `from` to `to` (both inside the workspace); an existing `to` is an error,
        /// never replaced. A symbolic link is renamed itself, not what it points to.
        pub fn rename(
            &self,
            from: &Path,
            from_display: &str,
            to: &Path,
            to_display: &str,
        ) -> Result<(), ToolError> {
            let (from_parent, from_name) = self.parent_of(from, from_display)?;
            let (to_parent, to_name) = self.parent_of(to, to_display)?;
            rustix::fs::renameat_with(
                &from_parent,
                from_name,
                &to_parent,
                to_name,
                rustix::fs::RenameFlags::NOREPLACE,
            )
            .map_err(|errno| match errno {
                Errno::EXIST => ToolError::Failed(format!("{to_display} already exists")),
                Errno::INVAL => {
                    ToolError::Failed(format!("cannot move {from_display} into itself"))
                }
                errno => fs_error(from_display, errno),
            })
        }

        /// Removes `relative`: a file or a link (never what a link points to), or a folder
        /// with everything in it. The root itself cannot be removed.
        pub fn remove(&self, relative: &Path, display: &str) -> Result<(), ToolError> {
            if relative.as_os_str().is_empty() {
                return Err(ToolError::InvalidArguments(
                    "the workspace root cannot be removed".into(),
                ));
            }
            let (parent, name) = self.parent_of(relative, display)?;
            remove_at(&parent, name).map_err(|errno| fs_error(display, errno))
        }

        /// Moves the file `source` (a path outside the workspace, on the same file system) to
        /// `relative` in one rename, replacing a file there; its parent folders are made. A
        /// folder or a link at `relative` is refused; so is a `source` that is not a regular
        /// file with one link. Fails with the OS's error when the rename would cross file
        /// systems (the caller copies instead).
        pub fn install(
            &self,
            source: &Path,
            relative: &Path,
            display: &str,
        ) -> Result<(), ToolError> {
            let Some(name) = relative.file_name() else {
                return Err(ToolError::InvalidArguments(format!(
                    "{display} is not a file path"
                )));
            };
            let (Some(source_dir), Some(source_name)) = (source.parent(), source.file_name())
            else {
                return Err(ToolError::InvalidArguments(
                    "the file to install has no folder".into(),
                ));
            };
            let from = rustix::fs::open(
                source_dir,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|errno| fs_error(display, errno))?;
            let stat = rustix::fs::statat(&from, source_name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|errno| fs_error(display, errno))?;
            if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
                || link_count(&stat) != 1
            {
                return Err(ToolError::Failed(format!(
                    "the file to put at {display} is not a plain file"
                )));
            }
            let parent =
                self.open_dir_creating(relative.parent().unwrap_or(Path::new("")), display)?;
            match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(existing)
                    if FileType::from_raw_mode(existing.st_mode) != FileType::RegularFile =>
                {
                    return Err(ToolError::Failed(format!(
                        "{display} exists and is not a file"
                    )));
                }
                _ => {}
            }
            rustix::fs::renameat(&from, source_name, &parent, name)
                .map_err(|errno| fs_error(display, errno))?;
            self.chown_at(&parent, name, display)
        }

        /// Removes the folder `relative` only when it is empty (a folder with anything in it is
        /// an error that says so).
        pub fn remove_empty_dir(&self, relative: &Path, display: &str) -> Result<(), ToolError> {
            let (parent, name) = self.parent_of(relative, display)?;
            rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR).map_err(|errno| match errno {
                Errno::NOTEMPTY | Errno::EXIST => {
                    ToolError::Failed(format!("{display} is a folder that is not empty"))
                }
                errno => fs_error(display, errno),
            })
        }

        /// Where the symbolic link `relative` points (the link itself, never followed).
        pub fn read_link(&self, relative: &Path, display: &str) -> Result<PathBuf, ToolError> {
            let (parent, name) = self.parent_of(relative, display)?;
            let target = rustix::fs::readlinkat(&parent, name, Vec::new())
                .map_err(|errno| fs_error(display, errno))?;
            Ok(PathBuf::from(OsString::from_vec(target.into_bytes())))
        }

        /// Creates the symbolic link `relative` pointing to `target` (its parent folders are
        /// made); an existing entry is an error. Nothing is followed: opening through the link
        /// later is judged like any other path.
        pub fn create_symlink(
            &self,
            relative: &Path,
            display: &str,
            target: &Path,
        ) -> Result<(), ToolError> {
            let Some(name) = relative.file_name() else {
                return Err(ToolError::InvalidArguments(format!(
                    "{display} names the workspace root"
                )));
            };
            let parent =
                self.open_dir_creating(relative.parent().unwrap_or(Path::new("")), display)?;
            rustix::fs::symlinkat(target, &parent, name).map_err(|errno| match errno {
                Errno::EXIST => ToolError::Failed(format!("{display} already exists")),
                errno => fs_error(display, errno),
            })?;
            self.chown_at(&parent, name, display)
        }

        /// Writes what `reader` gives to `relative` atomically (see [`Root::write_atomic`]);
        /// with `replace` false an existing file is an error. Answers the bytes written.
        pub fn write_atomic_from(
            &self,
            relative: &Path,
            display: &str,
            reader: &mut dyn std::io::Read,
            replace: bool,
        ) -> Result<(Written, u64), ToolError> {
            let Some(name) = relative.file_name() else {
                return Err(ToolError::InvalidArguments(format!(
                    "{display} is not a file path"
                )));
            };
            let parent_path = relative.parent().unwrap_or(Path::new(""));
            let parent = self.open_dir_creating(parent_path, display)?;
            let mode = match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                    FileType::RegularFile => {
                        let links = link_count(&stat);
                        if links > 1 {
                            return Err(hard_link_refusal(display, links));
                        }
                        Some(Mode::from_raw_mode(stat.st_mode) & Mode::from_raw_mode(0o777))
                    }
                    FileType::Symlink => {
                        // Say whether it would have led outside; either way it is not followed.
                        let target = self.resolve(relative, OFlags::PATH, Mode::empty());
                        return Err(match target {
                            Err(Errno::XDEV) => fs_error(display, Errno::XDEV),
                            _ => ToolError::Failed(format!(
                                "{display} is a symbolic link; write to the path it points to \
                                 instead"
                            )),
                        });
                    }
                    FileType::Directory => {
                        return Err(ToolError::Failed(format!(
                            "{display} is a folder, not a file"
                        )));
                    }
                    _ => {
                        return Err(ToolError::Failed(format!(
                            "{display} is not a regular file"
                        )));
                    }
                },
                Err(Errno::NOENT) => None,
                Err(errno) => return Err(fs_error(display, errno)),
            };
            if mode.is_some() && !replace {
                return Err(ToolError::Failed(format!("{display} already exists")));
            }
            let temp = temp_name(name);
            let fd = resolve_at(
                &parent,
                Path::new(&temp),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
                Mode::from_raw_mode(0o644),
            )
            .map_err(|errno| fs_error(display, errno))?;
            if let Some((uid, gid)) = self.owner {
                rustix::fs::fchown(&fd, Some(uid), Some(gid))
                    .map_err(|errno| fs_error(display, errno))?;
            }
            let written = copy_and_rename(fd, mode, reader, &parent, &temp, name, replace);
            if written.is_err() {
                // Best effort: the temporary file is ours and useless now.
                let _ = rustix::fs::unlinkat(&parent, &temp, AtFlags::empty());
            }
            let bytes = written.map_err(|error| match error.raw_os_error() {
                Some(code) if code == Errno::EXIST.raw_os_error() => {
                    ToolError::Failed(format!("{display} already exists"))
                }
                _ => ToolError::Failed(format!("{display} could not be written: {error}")),
            })?;
            let kind = if mode.is_some() {
                Written::Replaced
            } else {
                Written::Created
            };
            Ok((kind, bytes))
        }

        /// The parent folder of `relative` (resolved beneath the root) and its last name.
        fn parent_of<'a>(
            &self,
            relative: &'a Path,
            display: &str,
        ) -> Result<(OwnedFd, &'a std::ffi::OsStr), ToolError> {
            let Some(name) = relative.file_name() else {
                return Err(ToolError::InvalidArguments(format!(
                    "{display} names the workspace root"
                )));
            };
            let parent = self
                .resolve(
                    relative.parent().unwrap_or(Path::new("")),
                    OFlags::PATH | OFlags::DIRECTORY,
                    Mode::empty(),
                )
                .map_err(|errno| fs_error(display, errno))?;
            Ok((parent, name))
        }

        /// Gives `name` in `parent` to the root's owner, when files must be theirs.
        fn chown_at(
            &self,
            parent: &OwnedFd,
            name: &std::ffi::OsStr,
            display: &str,
        ) -> Result<(), ToolError> {
            if let Some((uid, gid)) = self.owner {
                rustix::fs::chownat(
                    parent,
                    name,
                    Some(uid),
                    Some(gid),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|errno| fs_error(display, errno))?;
            }
            Ok(())
        }

        /// Opens the folder `relative`, creating it and its missing parents.
        fn open_dir_creating(&self, relative: &Path, display: &str) -> Result<OwnedFd, ToolError> {
            let flags = OFlags::PATH | OFlags::DIRECTORY;
            match self.resolve(relative, flags, Mode::empty()) {
                Ok(dir) => return Ok(dir),
                Err(Errno::NOENT) => {}
                Err(errno) => return Err(fs_error(display, errno)),
            }
            let mut dir = self
                .resolve(Path::new(""), flags, Mode::empty())
                .map_err(|errno| fs_error(display, errno))?;
            let mut current = PathBuf::new();
            for component in relative.components() {
                let name = component.as_os_str();
                current.push(name);
                match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) => {
                        if let Some((uid, gid)) = self.owner {
                            rustix::fs::chownat(
                                &dir,
                                name,
                                Some(uid),
                                Some(gid),
                                AtFlags::SYMLINK_NOFOLLOW,
                            )
                            .map_err(|errno| fs_error(display, errno))?;
                        }
                    }
                    Err(Errno::EXIST) => {}
                    Err(errno) => return Err(fs_error(display, errno)),
                }
                // Re-resolved from the root, so a link planted here is judged like any other.
                dir = self
                    .resolve(&current, flags, Mode::empty())
                    .map_err(|errno| fs_error(display, errno))?;
            }
            Ok(dir)
        }
    }

    impl Entry {
        /// An entry named `name` with the status `stat` (taken without following it).
        /// (`st_mtime_nsec`'s type differs between targets.)
        #[allow(clippy::useless_conversion)]
        fn of(name: OsString, stat: &rustix::fs::Stat) -> Entry {
            let kind = match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => EntryKind::File,
                FileType::Directory => EntryKind::Dir,
                FileType::Symlink => EntryKind::Symlink,
                _ => EntryKind::Other,
            };
            let seconds = u64::try_from(stat.st_mtime).unwrap_or(0);
            let nanos = u64::try_from(stat.st_mtime_nsec).unwrap_or(0);
            let ns = |seconds: i128, nanos: i128| seconds * 1_000_000_000 + nanos;
            Entry {
                name,
                kind,
                size: u64::try_from(stat.st_size).unwrap_or(0),
                modified_ms: seconds
                    .saturating_mul(1000)
                    .saturating_add(nanos / 1_000_000),
                stamp: Stamp {
                    inode: u64::from(stat.st_ino),
                    modified_ns: ns(stat.st_mtime.into(), stat.st_mtime_nsec as i128),
                    changed_ns: ns(stat.st_ctime.into(), stat.st_ctime_nsec as i128),
                },
            }
        }
    }

    /// The number of hard links (`nlink_t` is `u64` on some targets, `u32` on others).
    #[allow(clippy::useless_conversion)]
    fn link_count(stat: &rustix::fs::Stat) -> u64 {
        u64::from(stat.st_nlink)
    }

    fn resolve_at(
        dir: &OwnedFd,
        relative: &Path,
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, Errno> {
        let path = if relative.as_os_str().is_empty() {
            Path::new(".")
        } else {
            relative
        };
        let mut attempts = 0;
        loop {
            match rustix::fs::openat2(dir, path, flags | OFlags::CLOEXEC, mode, RESOLVE) {
                Err(Errno::AGAIN | Errno::INTR) if attempts < 16 => attempts += 1,
                other => return other,
            }
        }
    }

    /// Copies `reader` into the temporary file, syncs it, and renames it over `name` (or, with
    /// `replace` false, to `name` only if nothing is there). Answers the bytes copied.
    fn copy_and_rename(
        fd: OwnedFd,
        mode: Option<Mode>,
        reader: &mut dyn std::io::Read,
        parent: &OwnedFd,
        temp: &OsString,
        name: &std::ffi::OsStr,
        replace: bool,
    ) -> std::io::Result<u64> {
        if let Some(mode) = mode {
            rustix::fs::fchmod(&fd, mode)?;
        }
        let mut file = File::from(fd);
        let bytes = copy_in_blocks(reader, &mut file)?;
        file.sync_all()?;
        drop(file);
        if replace {
            rustix::fs::renameat(parent, temp, parent, name)?;
        } else {
            rustix::fs::renameat_with(
                parent,
                temp,
                parent,
                name,
                rustix::fs::RenameFlags::NOREPLACE,
            )?;
        }
        Ok(bytes)
    }

    /// Copies `reader` into `file` a mebibyte at a time (`std::io::copy` from a `dyn Read` goes
    /// 8 KiB at a time: a large upload becomes tens of thousands of small writes).
    fn copy_in_blocks(reader: &mut dyn std::io::Read, file: &mut File) -> std::io::Result<u64> {
        use std::io::Write as _;
        let mut buffer = vec![0u8; 1024 * 1024];
        let mut copied = 0u64;
        loop {
            let read = match reader.read(&mut buffer) {
                Ok(0) => return Ok(copied),
                Ok(read) => read,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            };
            file.write_all(&buffer[..read])?;
            copied += read as u64;
        }
    }

    /// Removes `name` in `dir`: a folder with everything in it, anything else by unlinking it
    /// (a symbolic link itself, never what it points to). Each folder is opened by one name
    /// relative to its parent, without following links, so nothing outside is reached.
    fn remove_at(dir: &OwnedFd, name: &std::ffi::OsStr) -> Result<(), Errno> {
        let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
            return rustix::fs::unlinkat(dir, name, AtFlags::empty());
        }
        let child = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&child)? {
            let entry = entry?;
            let bytes = entry.file_name().to_bytes();
            if bytes != b"." && bytes != b".." {
                names.push(OsString::from_vec(bytes.to_vec()));
            }
        }
        for entry in names {
            remove_at(&child, &entry)?;
        }
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
    }

    /// `.<name>.agentry-<pid>-<n>.tmp`, unique within the process and across processes.
    fn temp_name(name: &std::ffi::OsStr) -> OsString {
        let count = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut temp = OsString::from(".");
        temp.push(name);
        temp.push(format!(".agentry-{}-{count}.tmp", std::process::id()));
        temp
    }

    /// A resolution failure as the model should read it.
    fn fs_error(display: &str, errno: Errno) -> ToolError {
        ToolError::Failed(match errno {
            Errno::XDEV => format!(
                "{display}: refused: the path leads outside the workspace (through a symbolic \
                 link or \"..\")"
            ),
            Errno::LOOP => format!(
                "{display}: refused: too many symbolic links, or a link the workspace tools do \
                 not follow"
            ),
            Errno::NOENT => format!("{display}: no such file or folder"),
            Errno::NOTDIR => format!("{display}: a part of the path is not a folder"),
            Errno::ISDIR => format!("{display} is a folder, not a file"),
            Errno::ACCESS | Errno::PERM => format!("{display}: permission denied"),
            Errno::NAMETOOLONG => format!("{display}: the path is too long"),
            Errno::NOSYS => "the workspace tools need Linux 5.6 or later (openat2)".to_owned(),
            errno => format!("{display}: {errno}"),
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod unsupported {
    use std::path::Path;

    use super::{Entry, File, ToolError, Written};

    /// A workspace root; only Linux has the confined resolution the tools need.
    #[derive(Debug)]
    pub struct Root {
        _private: (),
    }

    fn unsupported<T>() -> Result<T, ToolError> {
        Err(ToolError::Failed(
            "the workspace tools are available on Linux only (they need openat2)".into(),
        ))
    }

    impl Root {
        pub fn open(_path: &Path) -> Result<Root, ToolError> {
            unsupported()
        }

        pub fn path(&self) -> &Path {
            Path::new("")
        }

        pub fn open_read(
            &self,
            _relative: &Path,
            _display: &str,
        ) -> Result<(File, u64), ToolError> {
            unsupported()
        }

        pub fn check_dir(&self, _relative: &Path, _display: &str) -> Result<(), ToolError> {
            unsupported()
        }

        pub fn check_inside(&self, _relative: &Path, _display: &str) -> Result<(), ToolError> {
            unsupported()
        }

        pub fn write_atomic(
            &self,
            _relative: &Path,
            _display: &str,
            _bytes: &[u8],
        ) -> Result<Written, ToolError> {
            unsupported()
        }

        pub fn list_dir(&self, _relative: &Path, _display: &str) -> Result<Vec<Entry>, ToolError> {
            unsupported()
        }

        pub fn entry(&self, _relative: &Path, _display: &str) -> Result<Entry, ToolError> {
            unsupported()
        }

        pub fn create_dir(&self, _relative: &Path, _display: &str) -> Result<(), ToolError> {
            unsupported()
        }

        pub fn rename(
            &self,
            _from: &Path,
            _from_display: &str,
            _to: &Path,
            _to_display: &str,
        ) -> Result<(), ToolError> {
            unsupported()
        }

        pub fn remove(&self, _relative: &Path, _display: &str) -> Result<(), ToolError> {
            unsupported()
        }

        pub fn remove_empty_dir(&self, _relative: &Path, _display: &str) -> Result<(), ToolError> {
            unsupported()
        }

        pub fn install(
            &self,
            _source: &Path,
            _relative: &Path,
            _display: &str,
        ) -> Result<(), ToolError> {
            unsupported()
        }

        pub fn read_link(&self, _relative: &Path, _display: &str) -> Result<PathBuf, ToolError> {
            unsupported()
        }

        pub fn create_symlink(
            &self,
            _relative: &Path,
            _display: &str,
            _target: &Path,
        ) -> Result<(), ToolError> {
            unsupported()
        }

        pub fn write_atomic_from(
            &self,
            _relative: &Path,
            _display: &str,
            _reader: &mut dyn std::io::Read,
            _replace: bool,
        ) -> Result<(Written, u64), ToolError> {
            unsupported()
        }
    }
}
