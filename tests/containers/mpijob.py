# SPDX-License-Identifier: Apache-2.0
"""An MPIJob's pods as containers: kft-manifest's MPIJob laid out as the MPI Operator v0.8 lays
it out, the launcher's mpirun reaching the workers over ssh and running a kft program that
allreduces across the pods and checks the result.

    mpijob.py KFT_MANIFEST IMAGE [--workers N] [--slots S]

What the test does in place of the operator (kubeflow/mpi-operator pkg/controller/
mpi_job_controller.go, v0.8):
- workers are pods `<job>-worker-<i>` with subdomain `<job>` (the job's headless Service), so
  `<job>-worker-<i>.<job>.<namespace>.svc` resolves; the launcher is `<job>-launcher`;
- a worker whose first container has neither command nor args runs `/usr/sbin/sshd -De`;
  workers get K_MPI_JOB_ROLE=worker, the launcher K_MPI_JOB_ROLE=launcher and Open MPI's
  OMPI_MCA_orte_keep_fqdn_hostnames, OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile,
  OMPI_MCA_plm_rsh_args=-o ConnectionAttempts=10, OMPI_MCA_orte_set_default_slots;
- Secret `<job>-ssh` (an ECDSA P-521 key as id_rsa, its public half as id_rsa.pub and
  authorized_keys; mode 0644, 0600 only under /root/.ssh) is mounted at sshAuthMountPath in the
  first container of the launcher and of every worker; ConfigMap `<job>-config` at /etc/mpi in
  the launcher (hostfile 0444: `<host> slots=<slotsPerWorker>` per worker; discover_hosts.sh 0555);
- securityContext.runAsUser is honoured; with launcherCreationPolicy WaitForWorkersReady the
  launcher starts once every worker runs (no readiness probe: Ready = running).
Checks: the launcher exits 0, and the program reports its layout (N nodes) and every allreduce
averaged correctly.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pods  # noqa: E402

PROGRAM = "/opt/kft/examples/04-nodes"


def emit(tool, *args):
    r = subprocess.run([tool, *args], text=True, capture_output=True, timeout=60)
    if r.returncode != 0:
        pods.fail(f"kft-manifest {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def first_container(spec, role):
    cs = spec["template"]["spec"].get("containers") or []
    if not cs:
        pods.fail(f"{role}: the pod template has no container")
    return cs[0]


def run_as(container, pod_spec):
    sc = container.get("securityContext") or {}
    psc = pod_spec.get("securityContext") or {}
    return sc.get("runAsUser", psc.get("runAsUser"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kft_manifest")
    ap.add_argument("image")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--name", default="mpi-check")
    ap.add_argument("--timeout", type=float, default=180)
    a = ap.parse_args()

    pm = pods.Podman(a.image, f"mpijob-{a.workers}x{a.slots}")
    pm.skip_unless_usable()
    text = emit(a.kft_manifest, "mpijob", "--name", a.name, "--image", a.image, "--nodes", str(a.workers),
                "--nproc-per-node", str(a.slots), "--cpus", "1", "--memory", "1Gi", "--", PROGRAM)
    job = next(d for d in pods.load_yaml_documents(text) if d["kind"] == "MPIJob")
    name, ns = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    spec = job["spec"]
    if spec.get("mpiImplementation", "OpenMPI") != "OpenMPI":
        pods.fail(f"mpiImplementation {spec.get('mpiImplementation')}: the image has Open MPI")
    slots = int(spec.get("slotsPerWorker", 1))
    mount = spec.get("sshAuthMountPath", "/root/.ssh")
    launcher_spec, worker_spec = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    workers = int(worker_spec.get("replicas", 0))
    if workers != a.workers:
        pods.fail(f"the MPIJob has {workers} workers, asked for {a.workers}")
    svc = lambda host: f"{host}.{name}.{ns}.svc"  # noqa: E731

    try:
        with tempfile.TemporaryDirectory() as tmp:
            # Secret <job>-ssh, as the operator makes it (ECDSA P-521; generated inside the image,
            # so the host needs no ssh-keygen).
            ssh_dir = os.path.join(tmp, "ssh")
            os.makedirs(ssh_dir)
            pm("run", "--rm", "--network", "none", "--volume", f"{ssh_dir}:/k:rw", a.image,
               "ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-C", f"{name}-ssh", "-f", "/k/id_rsa")
            pub = open(os.path.join(ssh_dir, "id_rsa.pub")).read()
            with open(os.path.join(ssh_dir, "authorized_keys"), "w") as f:
                f.write(pub)
            mode = 0o600 if mount == "/root/.ssh" else 0o644
            for f in ("id_rsa", "id_rsa.pub", "authorized_keys"):
                os.chmod(os.path.join(ssh_dir, f), mode)
                os.chown(os.path.join(ssh_dir, f), 0, 0)
            # ConfigMap <job>-config.
            cfg = os.path.join(tmp, "mpi")
            os.makedirs(cfg)
            hosts = [svc(f"{name}-worker-{i}") for i in range(workers)]
            with open(os.path.join(cfg, "hostfile"), "w") as f:
                f.writelines(f"{h} slots={slots}\n" for h in hosts)
            with open(os.path.join(cfg, "discover_hosts.sh"), "w") as f:
                f.write("#!/bin/sh\n" + "".join(f"echo {h}\n" for h in hosts))
            os.chmod(os.path.join(cfg, "hostfile"), 0o444)
            os.chmod(os.path.join(cfg, "discover_hosts.sh"), 0o555)

            net = pm.network("net")
            pod_names = [f"{name}-worker-{i}" for i in range(workers)] + [f"{name}-launcher"]
            pod_aliases = {h: [h, f"{h}.{name}", svc(h)] for h in pod_names}
            ips = {h: pm.address(net) for h in pod_names}
            hosts = {alias: ips[h] for h in pod_names for alias in pod_aliases[h]}
            names = []
            for i in range(workers):
                c = first_container(worker_spec, "Worker")
                host = f"{name}-worker-{i}"
                cmd = list(c.get("command") or []) + list(c.get("args") or [])
                if not cmd:
                    cmd = ["/usr/sbin/sshd", "-De"]
                env = pods.env_of(c, {}, {})
                env["K_MPI_JOB_ROLE"] = "worker"
                names.append(pm.start(host, network=net, hostname=host, aliases=pod_aliases[host],
                                      env=env, command=cmd, mounts=[(ssh_dir, mount, True)],
                                      user=run_as(c, worker_spec["template"]["spec"]), ip=ips[host], hosts=hosts))
            # WaitForWorkersReady: every worker running.
            until = time.monotonic() + 60
            for n in names:
                while (state := pm("inspect", "--format", "{{.State.Status}}", n).stdout.strip()) != "running":
                    if state in ("exited", "stopped"):
                        pm.dump([n])
                        pods.fail(f"worker {n} exited before the launcher could start")
                    if time.monotonic() > until:
                        pm.dump(names)
                        pods.fail(f"worker {n} is not running after 60 s")
                    time.sleep(0.2)
            c = first_container(launcher_spec, "Launcher")
            cmd = list(c.get("command") or []) + list(c.get("args") or [])
            env = pods.env_of(c, {}, {})
            env.update({"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                        "OMPI_MCA_orte_set_default_slots": str(slots)})
            host = f"{name}-launcher"
            t0 = time.time()
            launcher = pm.start(host, network=net, hostname=host, aliases=pod_aliases[host],
                                env=env, command=cmd, user=run_as(c, launcher_spec["template"]["spec"]),
                                mounts=[(ssh_dir, mount, True), (cfg, "/etc/mpi", True)], ip=ips[host], hosts=hosts)
            code = pm.wait_all([launcher], a.timeout)[launcher]
            out = pm.logs(launcher)
            if code != 0:
                pm.dump(names + [launcher])
                pods.fail(f"the launcher's mpirun exited {code}")
            ranks = workers * slots
            layout = rf"{workers} nodes x {slots} ranks: hierarchical ran hierarchical, averaged \d+ floats correctly"
            if not re.search(layout, out):
                pm.dump([launcher])
                pods.fail(f"the launcher's output does not report {workers} nodes and a correct average")
            if re.search(r"wrong|mismatch|FAIL", out):
                pm.dump([launcher])
                pods.fail("the program reported a wrong result")
            pods.log(out.rstrip())
            pods.log(f"mpijob: launcher + {workers} workers x {slots} slots = {ranks} ranks over ssh: "
                     f"mpirun exited 0 in {time.time() - t0:.1f} s")
    finally:
        pm.cleanup()


if __name__ == "__main__":
    main()
