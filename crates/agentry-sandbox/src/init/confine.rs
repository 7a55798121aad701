//! PID 1 confines itself before serving, so every command inherits the policy: capabilities
//! dropped, `no_new_privs`, Landlock, and a seccomp deny-list pinned to the native architecture.
//!
//! On x86_64 a first filter refuses every syscall number of the x32 ABI (bit 30 set) with
//! `ENOSYS`: x32 calls carry the x86_64 audit architecture, so the deny-list's architecture check
//! lets them through, and their numbers match none of its rules.

use std::collections::BTreeMap;

use landlock::{
    ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
    path_beneath_rules,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Applies Landlock: read and execute everywhere, write only in `writable`; abstract unix sockets
/// and signals scoped to the sandbox. Returns the enforcement status.
pub(crate) fn landlock(writable: &[&str]) -> Result<String, String> {
    let abi = ABI::V6;
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi))))
        .and_then(|r| r.add_rules(path_beneath_rules(writable, AccessFs::from_all(abi))))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("landlock: {e}"))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "fully_enforced",
        RulesetStatus::PartiallyEnforced => "partially_enforced",
        RulesetStatus::NotEnforced => "not_enforced",
    }
    .to_string())
}

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// Syscalls denied outright with EPERM.
fn denied() -> Vec<i64> {
    let mut list = vec![
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_userfaultfd,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_mount_setattr,
        libc::SYS_syslog,
        libc::SYS_quotactl,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_fanotify_init,
        libc::SYS_vhangup,
    ];
    #[cfg(target_arch = "x86_64")]
    list.extend([
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_modify_ldt,
        libc::SYS_uselib,
        libc::SYS_ustat,
        libc::SYS_sysfs,
        libc::SYS_lookup_dcookie,
    ]);
    list
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conds).map_err(|e| e.to_string())
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    action: SeccompAction,
) -> Result<BpfProgram, String> {
    let filter =
        SeccompFilter::new(rules, SeccompAction::Allow, action, ARCH).map_err(|e| e.to_string())?;
    BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

/// `AUDIT_ARCH_X86_64`: `EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE` (libc lacks it).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

/// `__X32_SYSCALL_BIT`: x32 syscall numbers are the x86_64 ones with this bit set.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Offsets in `struct seccomp_data` of the syscall number and of the audit architecture.
#[cfg(target_arch = "x86_64")]
const DATA_NR: u32 = 0;
#[cfg(target_arch = "x86_64")]
const DATA_ARCH: u32 = 4;

#[cfg(target_arch = "x86_64")]
fn bpf(code: u32, k: u32, jt: u8, jf: u8) -> seccompiler::sock_filter {
    // The BPF opcodes are 16-bit values; libc declares them as u32.
    seccompiler::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The x32 filter: on the x86_64 architecture, any syscall number at or above
/// `0x40000000` returns `ENOSYS`; everything else is left to the other filters (which kill
/// another architecture).
#[cfg(target_arch = "x86_64")]
fn x32_filter() -> BpfProgram {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    vec![
        // 0: A = arch; not x86_64 -> 5 (allow here; the deny-list kills it).
        bpf(BPF_LD | BPF_W | BPF_ABS, DATA_ARCH, 0, 0),
        bpf(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 3),
        // 2: A = nr; nr >= 0x40000000 -> 4, else -> 5.
        bpf(BPF_LD | BPF_W | BPF_ABS, DATA_NR, 0, 0),
        bpf(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 0, 1),
        bpf(
            BPF_RET | BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
            0,
            0,
        ),
        bpf(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW, 0, 0),
    ]
}

/// The filters in the order they are installed, the x32 refusal first. The kernel runs every
/// filter on each syscall and keeps the most severe action, so an x32 number gets `ENOSYS`
/// whatever the later filters answer (they would allow it: it matches none of their rules).
fn filters() -> Result<Vec<BpfProgram>, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in denied() {
        rules.insert(nr, Vec::new());
    }
    // clone with any namespace flag: no nested namespaces.
    let ns_flags = [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWTIME,
    ];
    let mut clone_rules = Vec::new();
    for flag in ns_flags {
        let f = flag as u64;
        clone_rules.push(rule(vec![cond(0, SeccompCmpOp::MaskedEq(f), f)?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    // Terminal injection.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCSTI)?])?,
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCLINUX)?])?,
        ],
    );
    // Socket families with kernel attack surface and no use inside: packet, vsock, and every
    // netlink protocol but NETLINK_ROUTE. That one stays: `getifaddrs` reads the interfaces
    // through it (ZeroMQ, so Jupyter kernels, aborts without it), and without a capability
    // (every one is dropped) it only reads this sandbox's own network namespace (loopback).
    rules.insert(
        libc::SYS_socket,
        vec![
            rule(vec![
                cond(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)?,
                cond(2, SeccompCmpOp::Ne, libc::NETLINK_ROUTE as u64)?,
            ])?,
            rule(vec![cond(0, SeccompCmpOp::Eq, libc::AF_PACKET as u64)?])?,
            rule(vec![cond(0, SeccompCmpOp::Eq, libc::AF_VSOCK as u64)?])?,
        ],
    );
    let deny = compile(rules, SeccompAction::Errno(libc::EPERM as u32))?;
    // clone3 carries its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone.
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, Vec::new());
    let clone3 = compile(clone3, SeccompAction::Errno(libc::ENOSYS as u32))?;
    Ok(vec![
        #[cfg(target_arch = "x86_64")]
        x32_filter(),
        clone3,
        deny,
    ])
}

/// Installs the filters: the x32 refusal (x86_64), `clone3` as `ENOSYS`, then the deny-list.
/// Syscalls of another architecture (i386 `int 0x80`, for one) kill the process: the deny-list
/// checks the architecture first.
pub(crate) fn seccomp() -> Result<(), String> {
    for program in filters()? {
        seccompiler::apply_filter(&program).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic-BPF seccomp program (the instructions seccompiler and `x32_filter` emit)
    /// on `struct seccomp_data` built from `arch`, `nr` and `args`; returns the action.
    fn run(program: &[seccompiler::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        let word = |k: u32| {
            let k = k as usize;
            u32::from_ne_bytes([data[k], data[k + 1], data[k + 2], data[k + 3]])
        };
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let ins = &program[pc];
            let code = u32::from(ins.code);
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => acc = word(ins.k),
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => acc &= ins.k,
                c if c == libc::BPF_RET | libc::BPF_K => return ins.k,
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += ins.k as usize,
                c if c & 0x07 == libc::BPF_JMP => {
                    let taken = match c & 0xf0 {
                        x if x == libc::BPF_JEQ => acc == ins.k,
                        x if x == libc::BPF_JGT => acc > ins.k,
                        x if x == libc::BPF_JGE => acc >= ins.k,
                        x if x == libc::BPF_JSET => acc & ins.k != 0,
                        other => panic!("unexpected jump {other:#x}"),
                    };
                    pc += usize::from(if taken { ins.jt } else { ins.jf });
                }
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    /// What the kernel returns for a syscall under all `programs`: the most severe action
    /// (the lowest as a signed action value).
    fn outcome(programs: &[BpfProgram], arch: u32, nr: i64, args: [u64; 6]) -> u32 {
        programs
            .iter()
            .map(|p| run(p, arch, nr as u32, args))
            .min_by_key(|ret| (ret & libc::SECCOMP_RET_ACTION_FULL) as i32)
            .unwrap_or(libc::SECCOMP_RET_ALLOW)
    }

    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn seccomp_refuses_every_x32_syscall() {
        let programs = filters().unwrap();
        let arch = AUDIT_ARCH_X86_64;
        // The x32 forms of denied calls, of ordinary ones, and the edges of the x32 range.
        for nr in [
            libc::SYS_unshare,
            libc::SYS_mount,
            libc::SYS_bpf,
            libc::SYS_io_uring_setup,
            libc::SYS_keyctl,
            libc::SYS_ptrace,
            libc::SYS_clone,
            libc::SYS_read,
            0,
            0x3fff_ffff,
        ] {
            let x32 = nr | i64::from(X32_SYSCALL_BIT);
            assert_eq!(
                outcome(&programs, arch, x32, [0; 6]),
                ENOSYS,
                "x32 syscall {x32:#x}"
            );
        }
        // The deny-list alone lets them through: this is what the first filter closes.
        let deny = &programs[programs.len() - 1];
        let x32_unshare = (libc::SYS_unshare | i64::from(X32_SYSCALL_BIT)) as u32;
        assert_eq!(
            run(deny, arch, x32_unshare, [0; 6]),
            libc::SECCOMP_RET_ALLOW
        );
        assert_eq!(programs[0], x32_filter());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn seccomp_keeps_native_rules() {
        let programs = filters().unwrap();
        let arch = AUDIT_ARCH_X86_64;
        assert_eq!(
            outcome(&programs, arch, libc::SYS_read, [0; 6]),
            libc::SECCOMP_RET_ALLOW
        );
        assert_eq!(outcome(&programs, arch, libc::SYS_unshare, [0; 6]), EPERM);
        assert_eq!(outcome(&programs, arch, libc::SYS_clone3, [0; 6]), ENOSYS);
        let newuser = [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0];
        assert_eq!(outcome(&programs, arch, libc::SYS_clone, newuser), EPERM);
        assert_eq!(
            outcome(
                &programs,
                arch,
                libc::SYS_clone,
                [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]
            ),
            libc::SECCOMP_RET_ALLOW
        );
        // Sockets: netlink only for routing information (getifaddrs), no packet sockets.
        let socket = |family: i32, protocol: i32| {
            outcome(
                &programs,
                arch,
                libc::SYS_socket,
                [
                    family as u64,
                    libc::SOCK_RAW as u64,
                    protocol as u64,
                    0,
                    0,
                    0,
                ],
            )
        };
        assert_eq!(
            socket(libc::AF_NETLINK, libc::NETLINK_ROUTE),
            libc::SECCOMP_RET_ALLOW
        );
        for protocol in [
            libc::NETLINK_AUDIT,
            libc::NETLINK_NETFILTER,
            libc::NETLINK_XFRM,
            libc::NETLINK_KOBJECT_UEVENT,
            libc::NETLINK_GENERIC,
            libc::NETLINK_SOCK_DIAG,
        ] {
            assert_eq!(
                socket(libc::AF_NETLINK, protocol),
                EPERM,
                "netlink {protocol}"
            );
        }
        assert_eq!(socket(libc::AF_PACKET, 0), EPERM);
        assert_eq!(socket(libc::AF_VSOCK, 0), EPERM);
        assert_eq!(socket(libc::AF_INET, 0), libc::SECCOMP_RET_ALLOW);
        // Another architecture (i386) is killed by the deny-list.
        const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
        assert_eq!(
            outcome(&programs, AUDIT_ARCH_I386, 1, [0; 6]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }
}
