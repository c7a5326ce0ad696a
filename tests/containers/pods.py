# SPDX-License-Identifier: Apache-2.0
"""Kubernetes pods as podman containers, for the container tests.

What a cluster would give the pods of a TrainJob or an MPIJob, made here with podman: one
container network per test (a pod network), each container with the hostname and the DNS names
the controllers give (`--hostname`, `--network-alias`), the environment the controllers inject,
Secrets and ConfigMaps as files mounted where the manifests say. No API server runs: the test
reads the manifests kft-manifest writes and does what the controllers would do with them.

Every container and network a test makes carries its name prefix and is removed at the end,
also when the test fails. Every wait has a deadline.
"""
import datetime
import os
import re
import secrets
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = 77


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def log(msg):
    print(msg, flush=True)


def load_yaml_documents(text):
    try:
        import yaml
    except ImportError:
        print("SKIP: python3-yaml is missing (Debian: apt-get install python3-yaml; run with /usr/bin/python3)")
        sys.exit(SKIP)
    return [d for d in yaml.safe_load_all(text) if d]


class Podman:
    """podman with kft's settings (tools/image/containers.conf) and a name prefix per test."""

    def __init__(self, image, test):
        self.image = image
        self.prefix = f"kft-{test}-{os.getpid()}"
        self.env = dict(os.environ)
        self.env.setdefault("CONTAINERS_CONF", os.path.join(REPO, "tools", "image", "containers.conf"))
        self.containers = []
        self.networks = []
        self.subnets = {}

    def __call__(self, *args, timeout=60, check=True, capture=True):
        try:
            r = subprocess.run(["podman", *args], env=self.env, timeout=timeout, text=True,
                               stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)
        except subprocess.TimeoutExpired:
            fail(f"podman {' '.join(args[:3])} ... did not return within {timeout} s")
        if check and r.returncode != 0:
            fail(f"podman {' '.join(args)} exited {r.returncode}: {(r.stderr or '').strip()}")
        return r

    def skip_unless_usable(self):
        """Exits 77 with podman's own words when this host cannot run the image's containers."""
        if shutil.which("podman") is None:
            print("SKIP: podman is not installed (Debian: apt-get install podman runc)")
            sys.exit(SKIP)
        r = self("image", "exists", self.image, check=False)
        if r.returncode != 0:
            fail(f"image {self.image} is missing: the fixture test containers.image builds it (tools/image/build.sh)")
        r = self("run", "--rm", "--network", "none", self.image, "true", check=False)
        if r.returncode != 0:
            print(f"SKIP: this host refuses containers: podman run exited {r.returncode}: {r.stderr.strip()}")
            sys.exit(SKIP)

    def network(self, name):
        """A container network (a pod network). Pods get fixed addresses on it (address())."""
        full = f"{self.prefix}-{name}"
        self("network", "create", full)
        self.networks.append(full)
        subnet = self("network", "inspect", "--format", "{{range .Subnets}}{{.Subnet}}{{end}}", full).stdout.strip()
        m = re.match(r"(\d+\.\d+\.\d+)\.0/24$", subnet)
        if not m:
            fail(f"network {full} has subnet {subnet!r}, not the /24 podman gives by default")
        self.subnets[full] = (m.group(1), 10)
        return full

    def address(self, network):
        """The next free address on `network` (from .10 up), for start(ip=...)."""
        base, n = self.subnets[network]
        self.subnets[network] = (base, n + 1)
        return f"{base}.{n}"

    def start(self, name, *, network, hostname, aliases=(), env=None, command=(), mounts=(), user=None,
              workdir=None, ip=None, hosts=None):
        """Starts one pod's container, detached. Returns its container name.

        The pod's names resolve twice over: through the network's DNS (`--network-alias`, as a
        headless service publishes them) and through /etc/hosts entries for every pod of the job
        (`hosts`, name -> address, with `ip` this pod's fixed address). podman's DNS server
        (aardvark-dns 1.4) reloads on every container start and stop and answers "temporary
        failure" meanwhile, for seconds under the churn of these tests; a cluster's DNS does
        not, so the tests do not depend on it."""
        full = f"{self.prefix}-{name}"
        args = ["run", "-d", "--name", full, "--network", network, "--hostname", hostname]
        if ip:
            args += ["--ip", ip]
        for a in aliases:
            args += ["--network-alias", a]
        for h, addr in (hosts or {}).items():
            args += ["--add-host", f"{h}:{addr}"]
        for k, v in (env or {}).items():
            args += ["--env", f"{k}={v}"]
        for host_path, path, ro in mounts:
            args += ["--volume", f"{host_path}:{path}:{'ro' if ro else 'rw'}"]
        if user is not None:
            args += ["--user", str(user)]
        if workdir:
            args += ["--workdir", workdir]
        args += [self.image, *command]
        self(*args)
        self.containers.append(full)
        return full

    def exit_code(self, name, timeout):
        """Waits for a container to end; its exit status, or None at the deadline."""
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            r = self("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name, check=False)
            if r.returncode != 0:
                fail(f"container {name} vanished: {r.stderr.strip()}")
            state, code = r.stdout.split()
            if state in ("exited", "stopped"):
                return int(code)
            time.sleep(0.2)
        return None

    def wait_all(self, names, timeout):
        """{name: exit status} once all have ended; fails naming the ones still running at the deadline."""
        until = time.monotonic() + timeout
        codes = {}
        for n in names:
            left = max(0.0, until - time.monotonic())
            codes[n] = self.exit_code(n, left)
        late = [n for n, c in codes.items() if c is None]
        if late:
            self.dump(names)
            fail(f"still running after {timeout} s: {', '.join(late)}")
        return codes

    def logs(self, name, timestamps=False):
        r = self("logs", *(["--timestamps"] if timestamps else []), name, check=False)
        return (r.stdout or "") + (r.stderr or "")

    def dump(self, names):
        for n in names:
            log(f"---- podman logs {n} ----")
            log(self.logs(n).rstrip())

    def first_line_time(self, name, pattern):
        """The time (seconds since the epoch) of the first log line matching `pattern`, or None."""
        for line in self.logs(name, timestamps=True).splitlines():
            stamp, _, text = line.partition(" ")
            if re.search(pattern, text):
                return parse_rfc3339(stamp)
        return None

    def cleanup(self):
        if self.containers:
            self("rm", "--force", "--time", "0", *self.containers, check=False, timeout=120)
        for n in self.networks:
            self("network", "rm", "--force", n, check=False)
        self.containers, self.networks = [], []


def parse_rfc3339(stamp):
    # podman prints nanoseconds and a zone offset: 2026-12-06T10:13:33.123456789+00:00 (or Z).
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", stamp)
    if not m:
        return None
    base = datetime.datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return base.timestamp() + float("0." + (m.group(2) or "0"))


def random_token():
    return secrets.token_hex(16)


def env_of(container, secrets_by_name, field_values):
    """A container's env list as the kubelet resolves it: literal values, secretKeyRef, fieldRef."""
    out = {}
    for e in container.get("env") or []:
        name = e["name"]
        if "value" in e:
            out[name] = str(e["value"])
            continue
        ref = e.get("valueFrom") or {}
        if "secretKeyRef" in ref:
            s = ref["secretKeyRef"]
            if s["name"] not in secrets_by_name or s["key"] not in secrets_by_name[s["name"]]:
                fail(f"env {name}: Secret {s['name']} (key {s['key']}) does not exist: the pod would not start")
            out[name] = secrets_by_name[s["name"]][s["key"]]
        elif "fieldRef" in ref:
            path = ref["fieldRef"]["fieldPath"]
            if path not in field_values:
                fail(f"env {name}: fieldRef {path} is not one the test provides")
            out[name] = field_values[path]
        else:
            fail(f"env {name}: unsupported valueFrom {ref}")
    return out
