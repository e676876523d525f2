//! The OCI runtime specification of a sandbox container.
//!
//! Everything a sandbox is allowed is decided here: a user namespace mapping container
//! root to an unprivileged host range, its own pid/mount/ipc/uts/net/cgroup namespaces,
//! no new privileges, a minimal capability set for the agent (user commands run as an
//! unprivileged uid and keep none), a seccomp filter, masked and read-only kernel paths,
//! and cgroup limits on cpu, memory and pids.

use serde_json::{Value, json};

use crate::gvisor::Isolation;

/// Where the agent and its socket appear inside the sandbox. The socket directory is
/// mode 0700 and owned by the sandbox's root, so user commands cannot reach it.
pub const AGENT_PATH: &str = "/.sandbase/agent";
pub const CONTROL_DIR: &str = "/.sandbase/run";
pub const AGENT_SOCKET: &str = "/.sandbase/run/agent.sock";
/// The writable working directory (and home) of the sandbox user.
pub const WORK_DIR: &str = "/work";
/// The uid and gid user commands run as inside the sandbox.
pub const SANDBOX_USER: u32 = 1000;
/// How many ids each sandbox's user namespace maps.
pub const ID_RANGE: u32 = 65_536;

/// Every sandbox's `/etc/resolv.conf`, whatever its template says. The address is a
/// documentation one that never answers by itself: a sandbox with egress sends it through its
/// link, where nftables redirects port 53 to the node's DNS responder; one without has no
/// route at all.
pub const RESOLV_CONF: &str = "nameserver 192.0.2.53\noptions timeout:2 attempts:2\n";

/// What varies between sandboxes.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub hostname: String,
    /// First host uid/gid of this sandbox's range (container id 0 maps here).
    pub host_id_base: u32,
    /// Host path of the statically linked agent, bind-mounted read-only.
    pub agent_binary: String,
    /// Host directory bind-mounted at [`CONTROL_DIR`], where the agent listens.
    pub control_dir: String,
    /// Host file bind-mounted read-only at `/etc/resolv.conf` (see [`RESOLV_CONF`]).
    pub resolv_conf: String,
    /// A network namespace to join (`None`: a fresh one with loopback only).
    pub network_namespace: Option<String>,
    pub limits: Limits,
    /// Host directories bind-mounted in: (host path, path in the sandbox, read-only).
    pub volumes: Vec<(String, String, bool)>,
    pub isolation: Isolation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPU in thousandths of a core.
    pub cpu_millis: u32,
    pub memory_mb: u32,
    /// Size of the writable `/work`; `/tmp` gets a quarter of it (at least 16 MiB).
    pub disk_mb: u32,
    pub pids: u32,
}

impl Limits {
    /// The size of `/tmp` for this disk size.
    pub fn tmp_mb(&self) -> u32 {
        (self.disk_mb / 4).max(16)
    }
}

/// Capabilities of the agent (container root inside its user namespace): enough to switch
/// to the sandbox user, manage its files and signal its processes; nothing that reaches
/// the kernel's shared state. A process switching to a non-zero uid loses them all.
const AGENT_CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
];

/// Paths of the kernel that leak host information or allow host changes.
const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The CFS period the cpu limit is expressed in.
const CPU_PERIOD_US: u64 = 100_000;

/// Host threads a gVisor sandbox needs besides its tasks' (the Sentry's and the gofer's Go
/// threads).
pub const GVISOR_PIDS_ALLOWANCE: u32 = 256;
/// Host threads per task under gVisor's ptrace platform: a stub process per address space,
/// with a thread for each Sentry thread that has run it (measured: 31 sleeping tasks, 287
/// host threads; a fork bomb held at 64 tasks passed 896).
pub const GVISOR_TASK_THREADS: u32 = 32;
/// Memory of a gVisor sandbox's Sentry and gofer beyond what its tasks use, added to its
/// memory cgroup (and to what the node reserves for it).
pub const GVISOR_MEMORY_ALLOWANCE_MB: u32 = 128;

/// The cgroup settings of `limits` (OCI `LinuxResources`), also what a running sandbox's
/// limits are updated to. Under gVisor the pids cgroup holds the Sentry too (the tasks
/// themselves are held to `limits.pids` by the Sentry's RLIMIT_NPROC).
pub fn linux_resources(limits: Limits, isolation: Isolation) -> Value {
    let memory_mb = match isolation {
        Isolation::Runc => limits.memory_mb,
        Isolation::Gvisor => limits.memory_mb.saturating_add(GVISOR_MEMORY_ALLOWANCE_MB),
    };
    let memory_bytes = u64::from(memory_mb) * 1024 * 1024;
    let cpu_quota = u64::from(limits.cpu_millis) * CPU_PERIOD_US / 1000;
    let pids = match isolation {
        Isolation::Runc => limits.pids,
        Isolation::Gvisor => limits
            .pids
            .saturating_mul(GVISOR_TASK_THREADS)
            .saturating_add(GVISOR_PIDS_ALLOWANCE),
    };
    json!({
        "devices": [{ "allow": false, "access": "rwm" }],
        "memory": { "limit": memory_bytes, "swap": memory_bytes },
        "cpu": { "quota": cpu_quota, "period": CPU_PERIOD_US },
        "pids": { "limit": pids },
    })
}

pub fn oci_spec(sandbox: &SandboxSpec) -> Value {
    let limits = sandbox.limits;
    let gvisor = sandbox.isolation == Isolation::Gvisor;
    let mut namespaces = vec![
        json!({ "type": "pid" }),
        json!({ "type": "ipc" }),
        json!({ "type": "uts" }),
        json!({ "type": "mount" }),
        json!({ "type": "cgroup" }),
    ];
    // Under gVisor the user namespace is the Sentry's own (runsc runs it as an unprivileged
    // process of its own); its root file system is the template's unshifted copy.
    if !gvisor {
        namespaces.push(json!({ "type": "user" }));
    }
    namespaces.push(match &sandbox.network_namespace {
        Some(path) => json!({ "type": "network", "path": path }),
        None => json!({ "type": "network" }),
    });
    let mut mounts = vec![
        json!({ "destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"] }),
        json!({ "destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] }),
        json!({ "destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] }),
        json!({ "destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=67108864"] }),
        json!({ "destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"] }),
        json!({ "destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"] }),
        json!({ "destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["nosuid", "noexec", "nodev", "relatime", "ro"] }),
        json!({ "destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", format!("size={}m", limits.tmp_mb())] }),
        json!({ "destination": WORK_DIR, "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755", format!("uid={SANDBOX_USER}"), format!("gid={SANDBOX_USER}"), format!("size={}m", limits.disk_mb)] }),
        json!({ "destination": AGENT_PATH, "type": "bind", "source": sandbox.agent_binary, "options": ["rbind", "ro", "nosuid", "nodev"] }),
        json!({ "destination": CONTROL_DIR, "type": "bind", "source": sandbox.control_dir, "options": ["rbind", "rw", "nosuid", "nodev", "noexec"] }),
        json!({ "destination": "/etc/resolv.conf", "type": "bind", "source": sandbox.resolv_conf, "options": ["rbind", "ro", "nosuid", "nodev", "noexec"] }),
    ];
    for (host, destination, read_only) in &sandbox.volumes {
        mounts.push(json!({
            "destination": destination,
            "type": "bind",
            "source": host,
            "options": ["rbind", if *read_only { "ro" } else { "rw" }, "nosuid", "nodev"],
        }));
    }
    let mut rlimits = vec![json!({ "type": "RLIMIT_NOFILE", "hard": 4096, "soft": 1024 })];
    // gVisor's tasks are not host processes, so the pids cgroup does not count them: the
    // Sentry holds the sandbox to the same number.
    if gvisor {
        let pids = limits.pids;
        rlimits.push(json!({ "type": "RLIMIT_NPROC", "hard": pids, "soft": pids }));
    }
    let mut spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": [AGENT_PATH, "--socket", AGENT_SOCKET],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"],
            "cwd": "/",
            "capabilities": {
                "bounding": AGENT_CAPABILITIES,
                "effective": AGENT_CAPABILITIES,
                "permitted": AGENT_CAPABILITIES,
                "inheritable": [],
                "ambient": [],
            },
            "rlimits": rlimits,
            // A sandbox is the first thing the host's OOM killer takes, never the worker,
            // containerd or the proxy: the agent at 500, what it starts at 1000.
            "oomScoreAdj": 500,
            "noNewPrivileges": true,
        },
        // Read-only: the only writable places are the size-capped /work, /tmp and /dev/shm.
        "root": { "path": "rootfs", "readonly": true },
        "hostname": sandbox.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "resources": linux_resources(limits, sandbox.isolation),
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
            "seccomp": crate::seccomp::profile(),
        },
    });
    if !gvisor {
        let id_mapping =
            json!([{ "containerID": 0, "hostID": sandbox.host_id_base, "size": ID_RANGE }]);
        spec["linux"]["uidMappings"] = id_mapping.clone();
        spec["linux"]["gidMappings"] = id_mapping;
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Value {
        oci_spec(&SandboxSpec {
            hostname: "sandbox".to_owned(),
            host_id_base: 200_000,
            agent_binary: "/var/lib/sandbase/agent".to_owned(),
            control_dir: "/run/sandbase/sandboxes/x".to_owned(),
            resolv_conf: "/run/sandbase/sandboxes/resolv.conf".to_owned(),
            network_namespace: None,
            limits: Limits {
                cpu_millis: 1500,
                memory_mb: 512,
                disk_mb: 1024,
                pids: 256,
            },
            volumes: vec![("/srv/data".to_owned(), "/data".to_owned(), true)],
            isolation: Isolation::Runc,
        })
    }

    #[test]
    fn container_root_is_an_unprivileged_host_range() {
        let spec = spec();
        let namespaces: Vec<&str> = spec["linux"]["namespaces"]
            .as_array()
            .expect("namespaces")
            .iter()
            .map(|namespace| namespace["type"].as_str().expect("type"))
            .collect();
        for required in ["pid", "ipc", "uts", "mount", "user", "network", "cgroup"] {
            assert!(
                namespaces.contains(&required),
                "missing {required} namespace"
            );
        }
        for mappings in ["uidMappings", "gidMappings"] {
            let mapping = &spec["linux"][mappings][0];
            assert_eq!(mapping["containerID"], 0);
            assert_eq!(mapping["hostID"], 200_000);
            assert_eq!(mapping["size"], ID_RANGE);
        }
    }

    #[test]
    fn privileges_are_minimal() {
        let spec = spec();
        assert_eq!(spec["process"]["noNewPrivileges"], true);
        let capabilities = &spec["process"]["capabilities"];
        for set in ["bounding", "effective", "permitted"] {
            let granted: Vec<&str> = capabilities[set]
                .as_array()
                .expect("set")
                .iter()
                .map(|capability| capability.as_str().expect("name"))
                .collect();
            for dangerous in [
                "CAP_SYS_ADMIN",
                "CAP_NET_ADMIN",
                "CAP_SYS_PTRACE",
                "CAP_SYS_MODULE",
                "CAP_NET_RAW",
                "CAP_MKNOD",
                "CAP_SYS_CHROOT",
            ] {
                assert!(!granted.contains(&dangerous), "{dangerous} in {set}");
            }
        }
        assert_eq!(capabilities["ambient"], json!([]));
        assert_eq!(capabilities["inheritable"], json!([]));
        assert_eq!(spec["linux"]["resources"]["devices"][0]["allow"], false);
        assert_eq!(spec["linux"]["seccomp"], crate::seccomp::profile());
    }

    #[test]
    fn limits_become_cgroup_settings() {
        let resources = &spec()["linux"]["resources"];
        assert_eq!(resources["memory"]["limit"], 512u64 * 1024 * 1024);
        assert_eq!(resources["memory"]["swap"], 512u64 * 1024 * 1024);
        assert_eq!(resources["cpu"]["quota"], 150_000);
        assert_eq!(resources["cpu"]["period"], 100_000);
        assert_eq!(resources["pids"]["limit"], 256);
        let spec = spec();
        let mounts = spec["mounts"].as_array().expect("mounts");
        let size_of = |destination: &str| {
            mounts
                .iter()
                .find(|mount| mount["destination"] == destination)
                .and_then(|mount| {
                    mount["options"]
                        .as_array()
                        .expect("options")
                        .iter()
                        .find_map(|option| option.as_str()?.strip_prefix("size="))
                        .map(str::to_owned)
                })
        };
        assert_eq!(size_of(WORK_DIR).as_deref(), Some("1024m"));
        assert_eq!(size_of("/tmp").as_deref(), Some("256m"));
        assert_eq!(spec["root"]["readonly"], true);
    }

    #[test]
    fn the_agent_is_read_only_and_its_socket_is_in_its_own_directory() {
        let spec = spec();
        let mounts = spec["mounts"].as_array().expect("mounts");
        let agent = mounts
            .iter()
            .find(|mount| mount["destination"] == AGENT_PATH)
            .expect("agent mount");
        assert!(
            agent["options"]
                .as_array()
                .expect("options")
                .contains(&json!("ro"))
        );
        let control = mounts
            .iter()
            .find(|mount| mount["destination"] == CONTROL_DIR)
            .expect("control mount");
        assert!(
            control["options"]
                .as_array()
                .expect("options")
                .contains(&json!("noexec"))
        );
        assert!(AGENT_SOCKET.starts_with(CONTROL_DIR));
        assert_eq!(spec["process"]["args"][0], AGENT_PATH);
        for masked in ["/proc/kcore", "/proc/keys", "/sys/firmware"] {
            assert!(
                spec["linux"]["maskedPaths"]
                    .as_array()
                    .expect("masked")
                    .contains(&json!(masked))
            );
        }
    }
}
