#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Self-test of tests/manifest/validate.py (run by CTest with /usr/bin/python3).

(a) every shipped runtime (<schemas>/runtimes) and every upstream example
    (<schemas>/examples/*) validates cleanly; the converted CRD schemas are valid
    Draft 7 schemas;
(b) negative cases, built by deep-copying a valid upstream document and mutating one
    thing, are rejected with the expected message fragment (and JSON path);
(c) the command line: exit codes 0/1/2, stdin, output format, KFT_SCHEMAS_DIR.

Prints one line per case and "test_validator: N passed, M failed"; exits 1 on failure.
"""

import copy
import glob
import importlib.util
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATE_PY = os.path.join(HERE, "validate.py")

_spec = importlib.util.spec_from_file_location("kft_manifest_validate", VALIDATE_PY)
validate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(validate)

SCHEMAS = os.environ.get("KFT_SCHEMAS_DIR") or validate.default_schemas_dir()

# Upstream documents that legitimately fail one of validate.py's extra checks, as
# {"<path relative to SCHEMAS>": "reason"}.  Empty: the one conflict found (runtime names
# such as "torchtune-llama3.2-1b" are not DNS-1035 labels) was a wrong check, fixed in
# validate.py (runtime names follow the generic RFC 1123 subdomain rule).
KNOWN_EXCEPTIONS = {}

RESULTS = {"passed": 0, "failed": 0}


def report(name, ok, detail=""):
    if ok:
        RESULTS["passed"] += 1
        print("PASS %s" % name)
    else:
        RESULTS["failed"] += 1
        print("FAIL %s%s" % (name, (": " + detail) if detail else ""))


def load_file(rel):
    """Documents of one file under SCHEMAS."""
    path = os.path.join(SCHEMAS, rel)
    with open(path, "r", encoding="utf-8") as fh:
        return validate.load_documents(fh.read(), rel)


def first_doc(rel, kind):
    for doc in load_file(rel):
        if isinstance(doc.data, dict) and doc.data.get("kind") == kind:
            return doc.data
    raise RuntimeError("no %s in %s" % (kind, rel))


VALIDATOR = validate.ManifestValidator(SCHEMAS)


def problems_of(*datas):
    """Validate in-memory documents together; returns the output lines."""
    docs = [validate.Document("<test>", i + 1, copy.deepcopy(d)) for i, d in enumerate(datas)]
    VALIDATOR.validate(docs)
    return [line for doc in docs for line in doc.lines()]


# --------------------------------------------------------------------------------------------
# (a) positive: upstream documents and schema conversion
# --------------------------------------------------------------------------------------------

def test_upstream_documents():
    files = sorted(glob.glob(os.path.join(SCHEMAS, "runtimes", "*.yaml")) +
                   glob.glob(os.path.join(SCHEMAS, "examples", "*", "*.yaml")))
    report("upstream documents found", len(files) >= 14, "only %d files" % len(files))
    for path in files:
        rel = os.path.relpath(path, SCHEMAS)
        docs = load_file(rel)
        VALIDATOR.validate(docs)
        lines = [line for doc in docs for line in doc.lines()]
        if rel in KNOWN_EXCEPTIONS:
            report("upstream %s fails as documented (%s)" % (rel, KNOWN_EXCEPTIONS[rel]),
                   bool(lines), "no longer fails: remove it from KNOWN_EXCEPTIONS")
        else:
            report("upstream %s (%d docs) validates" % (rel, len(docs)),
                   bool(docs) and not lines, "; ".join(lines) or "no documents")


def test_schema_conversion():
    jsonschema = validate.jsonschema
    for key in sorted(validate.SUPPORTED_KINDS):
        name = "converted schema %s %s" % key
        if not VALIDATOR.crds.has(*key):
            report(name, False, "CRD missing in %s" % SCHEMAS)
            continue
        converted = validate.convert_schema(VALIDATOR.crds.raw[key], top_level=True)
        try:
            jsonschema.Draft7Validator.check_schema(converted)
            ok, detail = True, ""
        except jsonschema.exceptions.SchemaError as exc:
            ok, detail = False, exc.message
        report(name + " is valid Draft 7", ok, detail)

        leftovers, patterns, closed = [], [], [0]

        def walk(node):
            if isinstance(node, dict):
                for k, v in node.items():
                    if k == "description" or str(k).startswith("x-kubernetes-") or k == "nullable":
                        leftovers.append(k)
                    if k == "pattern" and isinstance(v, str):
                        patterns.append(v)
                    if k == "additionalProperties" and v is False:
                        closed[0] += 1
                    if k not in ("enum", "default", "required"):
                        walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)
        walk(converted)
        report(name + " has no description/x-kubernetes-*/nullable left", not leftovers,
               ", ".join(sorted(set(leftovers))))
        report(name + " closes objects (additionalProperties: false)", closed[0] > 10,
               "%d closed objects" % closed[0])
        bad = []
        for pat in patterns:
            try:
                re.compile(pat)
            except re.error as exc:
                bad.append("%s (%s)" % (pat, exc))
        report(name + " patterns compile in Python", not bad, "; ".join(bad))

    # int-or-string: anyOf integer/string, no type, pattern kept beside it
    sample = {"type": "object", "properties": {"q": {
        "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": "^[0-9]+$",
        "x-kubernetes-int-or-string": True, "description": "d"}}}
    q = validate.convert_schema(sample)["properties"]["q"]
    report("int-or-string conversion", q == {"anyOf": [{"type": "integer"}, {"type": "string"}],
                                             "pattern": "^[0-9]+$"}, repr(q))
    n = validate.convert_schema({"type": "string", "nullable": True})
    report("nullable conversion", n == {"type": ["string", "null"]}, repr(n))
    p = validate.convert_schema({"type": "object", "properties": {"a": {"type": "string"}},
                                 "x-kubernetes-preserve-unknown-fields": True})
    report("preserve-unknown-fields stays open", "additionalProperties" not in p, repr(p))


# --------------------------------------------------------------------------------------------
# (b) negative cases
# --------------------------------------------------------------------------------------------

TRAINJOB = first_doc("examples/trainer/02-runtime-patches.yaml", "TrainJob")
MPIJOB = first_doc("examples/mpi-operator/pi.yaml", "MPIJob")
TORCH_RT = first_doc("runtimes/torch_distributed.yaml", "ClusterTrainingRuntime")
MPI_RT = first_doc("runtimes/deepspeed_distributed.yaml", "ClusterTrainingRuntime")


def patch_pod_spec(doc):
    """Pod spec of the first runtimePatch's first replicated job in TRAINJOB copies."""
    return (doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
            ["replicatedJobs"][0]["template"]["spec"]["template"]["spec"])


def rt_job(doc, name):
    for job in doc["spec"]["template"]["spec"]["replicatedJobs"]:
        if job["name"] == name:
            return job
    raise KeyError(name)


def rt_container(doc, job, name="node"):
    for c in rt_job(doc, job)["template"]["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise KeyError(name)


def m_set(path, value):
    """Mutation: set a nested key (creating mappings on the way)."""
    def mutate(doc):
        obj = doc
        for key in path[:-1]:
            obj = obj.setdefault(key, {}) if isinstance(key, str) else obj[key]
        obj[path[-1]] = value
    return mutate


def m_del(path):
    def mutate(doc):
        obj = doc
        for key in path[:-1]:
            obj = obj[key]
        del obj[path[-1]]
    return mutate


def m_name(n):
    return m_set(["metadata", "name"], "a" * n)


def m_numnodes_name(name_len, nodes):
    def mutate(doc):
        doc["metadata"]["name"] = "t" * name_len
        doc["spec"]["trainer"]["numNodes"] = nodes
    return mutate


def m_env(*entries):
    def mutate(doc):
        doc["spec"]["trainer"]["env"] = [dict(e) for e in entries]
    return mutate


def m_pod_failure_policy(values, restart="Never", operator="In", container="node"):
    """Mutation: the runtime's node Job gets a podFailurePolicy with one onExitCodes rule."""
    def mutate(doc):
        job = rt_job(doc, "node")["template"]["spec"]
        job["podFailurePolicy"] = {"rules": [{"action": "FailJob", "onExitCodes": {
            "containerName": container, "operator": operator, "values": values}}]}
        if restart is not None:
            job["template"]["spec"]["restartPolicy"] = restart
    return mutate


def m_jobset_rule(**rule):
    def mutate(doc):
        doc["spec"]["template"]["spec"]["failurePolicy"] = {"rules": [dict({"action": "FailJobSet"}, **rule)]}
    return mutate



NEGATIVES = [
    # Failure rules (kft-manifest runtime writes them; docs/kubernetes.md "Failure rules")
    ("podFailurePolicy without restartPolicy Never", TORCH_RT, m_pod_failure_policy([2], restart=None),
     "podFailurePolicy needs the pod's restartPolicy Never", None),
    ("podFailurePolicy with restartPolicy OnFailure", TORCH_RT, m_pod_failure_policy([2], restart="OnFailure"),
     "podFailurePolicy needs the pod's restartPolicy Never", None),
    ("onExitCodes values unsorted", TORCH_RT, m_pod_failure_policy([127, 2]),
     "values must be sorted ascending and unique", None),
    ("onExitCodes values duplicated", TORCH_RT, m_pod_failure_policy([2, 2]),
     "values must be sorted ascending and unique", None),
    ("onExitCodes 0 with In", TORCH_RT, m_pod_failure_policy([0, 2]), "value 0 cannot be used with operator In", None),
    ("onExitCodes unknown container", TORCH_RT, m_pod_failure_policy([2], container="main"),
     "container 'main' does not exist", None),
    ("JobSet rule name with a dash", TORCH_RT, m_jobset_rule(name="kft-usage"), "rule name 'kft-usage' does not match",
     "$.spec.template.spec.failurePolicy.rules[0].name"),
    ("JobSet rule name ending in a colon", TORCH_RT, m_jobset_rule(name="kft:"), "does not match", None),
    ("JobSet rule unknown target", TORCH_RT, m_jobset_rule(name="r", targetReplicatedJobs=["nodes"]),
     "replicated job 'nodes' does not exist", None),
    ("JobSet rule bad pattern", TORCH_RT, m_jobset_rule(name="r", onJobFailureMessagePatterns=["exit code (2"]),
     "not a regular expression", None),
    # (case, base, mutation, expected message fragment, expected path prefix or None)
    ("numProcPerNode auto", TRAINJOB, m_set(["spec", "trainer", "numProcPerNode"], "auto"),
     "'auto' is not of type 'integer'", "$.spec.trainer.numProcPerNode"),
    ("podTemplateOverrides removed field", TRAINJOB,
     m_set(["spec", "podTemplateOverrides"], [{"targetJobs": [{"name": "node"}]}]),
     "'podTemplateOverrides' was unexpected", "$.spec"),
    ("spec.labels removed field", TRAINJOB, m_set(["spec", "labels"], {"a": "b"}),
     "'labels' was unexpected", "$.spec"),
    ("missing runtimeRef", TRAINJOB, m_del(["spec", "runtimeRef"]),
     "'runtimeRef' is a required property", "$.spec"),
    ("runtime mpiImplementation OpenMPII", MPI_RT,
     m_set(["spec", "mlPolicy", "mpi", "mpiImplementation"], "OpenMPII"),
     "'OpenMPII' is not one of", "$.spec.mlPolicy.mpi.mpiImplementation"),
    ("MPIJob mpiImplementation OpenMPII", MPIJOB, m_set(["spec", "mpiImplementation"], "OpenMPII"),
     "'OpenMPII' is not one of", "$.spec.mpiImplementation"),
    ("string containerPort", TORCH_RT,
     lambda d: rt_container(d, "node").__setitem__("ports", [{"containerPort": "29500"}]),
     "'29500' is not of type 'integer'", "$.spec.template.spec.replicatedJobs[0]"),
    ("quantity 4Gix", TRAINJOB, m_set(["spec", "trainer", "resourcesPerNode", "limits", "memory"],
                                      "4Gix"),
     "'4Gix' does not match", "$.spec.trainer.resourcesPerNode.limits.memory"),
    ("quantity list", TRAINJOB, m_set(["spec", "trainer", "resourcesPerNode", "limits", "cpu"],
                                      [1]),
     "is not valid under any of the given schemas", "$.spec.trainer.resourcesPerNode.limits.cpu"),
    ("env value integer", TRAINJOB, m_env({"name": "A", "value": 1}),
     "1 is not of type 'string'", "$.spec.trainer.env[0].value"),
    ("TrainJob name uppercase", TRAINJOB, m_set(["metadata", "name"], "MyJob"),
     "RFC 1035 DNS label", "$.metadata.name"),
    ("TrainJob name starts with digit", TRAINJOB, m_set(["metadata", "name"], "1job"),
     "RFC 1035 DNS label", "$.metadata.name"),
    ("TrainJob name 64 chars", TRAINJOB, m_name(64), "no more than 63 characters",
     "$.metadata.name"),
    ("pod-name budget 50 chars x 100 nodes", TRAINJOB, m_numnodes_name(50, 100),
     "pod name", "$.metadata.name"),
    ("pod-name budget 48 chars x 100 nodes", TRAINJOB, m_numnodes_name(48, 100),
     "at most 47 characters", "$.metadata.name"),
    ("pod-name budget MPI launcher", TRAINJOB,
     lambda d: (m_numnodes_name(45, 2)(d),
                d["spec"].__setitem__("runtimeRef", {"name": "deepspeed-distributed"}),
                d["spec"].pop("runtimePatches")),
     "-launcher-0-0-abcde", "$.metadata.name"),
    ("reserved env PET_NNODES", TRAINJOB, m_env({"name": "PET_NNODES", "value": "2"}),
     "PET_NNODES is reserved", "$.spec.trainer.env[0].name"),
    ("reserved env OMPI_MCA_plm_rsh_args", TRAINJOB,
     m_env({"name": "X", "value": "1"}, {"name": "OMPI_MCA_plm_rsh_args", "value": "x"}),
     "is reserved", "$.spec.trainer.env[1].name"),
    ("reserved env DMLC_NUM_WORKER", TRAINJOB, m_env({"name": "DMLC_NUM_WORKER", "value": "2"}),
     "is reserved", "$.spec.trainer.env[0].name"),
    ("env name duplicated", TRAINJOB, m_env({"name": "A", "value": "1"}, {"name": "A", "value": "2"}),
     "duplicate entry for list-map key name=\"A\"", "$.spec.trainer.env[1]"),
    ("runtime container env duplicated", TORCH_RT,
     lambda d: rt_container(d, "node").__setitem__("env", [{"name": "X"}, {"name": "X"}]),
     "duplicate entry for list-map key name=\"X\"", "$.spec.template.spec.replicatedJobs[0]"),
    ("runtime container names duplicated", TORCH_RT,
     lambda d: rt_job(d, "node")["template"]["spec"]["template"]["spec"]["containers"].append(
         {"name": "node", "image": "x"}),
     "duplicate entry for list-map key name=\"node\"", "$.spec.template.spec.replicatedJobs[0]"),
    ("runtime replicatedJobs names duplicated", TORCH_RT,
     lambda d: d["spec"]["template"]["spec"]["replicatedJobs"].append(
         copy.deepcopy(rt_job(d, "node"))),
     "duplicate entry for list-map key name=\"node\"", "$.spec.template.spec.replicatedJobs[1]"),
    ("runtimePatches manager without domain", TRAINJOB,
     m_set(["spec", "runtimePatches", 0, "manager"], "platform-team"),
     "domain-prefixed path", "$.spec.runtimePatches[0].manager"),
    ("runtimePatches manager prefix not a domain", TRAINJOB,
     m_set(["spec", "runtimePatches", 0, "manager"], "kft/manifest"),
     "domain-prefixed path", "$.spec.runtimePatches[0].manager"),
    ("runtimePatches managers duplicated", TRAINJOB,
     lambda d: d["spec"]["runtimePatches"].append(copy.deepcopy(d["spec"]["runtimePatches"][0])),
     "duplicate entry for list-map key manager", "$.spec.runtimePatches[1]"),
    ("runtimePatches env on node container", TRAINJOB,
     lambda d: patch_pod_spec(d).__setitem__("containers", [{"name": "node", "env": [
         {"name": "A", "value": "1"}]}]),
     "may not set env on container 'node'", "$.spec.runtimePatches[0]"),
    ("runtimePatches unknown job (runtime resolved)", TRAINJOB,
     m_set(["spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "spec",
            "replicatedJobs", 0, "name"], "worker"),
     "replicated job 'worker' does not exist in ClusterTrainingRuntime torch-distributed",
     "$.spec.runtimePatches[0]"),
    ("runtimePatches unknown container (runtime resolved)", TRAINJOB,
     lambda d: patch_pod_spec(d).__setitem__("containers", [{"name": "sidecar"}]),
     "container 'sidecar' does not exist", "$.spec.runtimePatches[0]"),
    ("runtimePatches forbidden pod field", TRAINJOB,
     lambda d: patch_pod_spec(d).__setitem__("schedulerName", "volcano"),
     "'schedulerName' was unexpected", "$.spec.runtimePatches[0]"),
    ("initializer without runtime job", TRAINJOB,
     m_set(["spec", "initializer"], {"dataset": {"storageUri": "hf://tatsu-lab/alpaca"}}),
     "has no dataset-initializer job", "$.spec.initializer.dataset"),
    ("storageUri without scheme", TRAINJOB,
     m_set(["spec", "initializer"], {"model": {"storageUri": "tatsu-lab/alpaca"}}),
     "must be a valid URI", "$.spec.initializer.model.storageUri"),
    ("managedBy not allowed", TRAINJOB, m_set(["spec", "managedBy"], "example.com/other"),
     "ManagedBy must be", "$.spec.managedBy"),
    ("runtimeRef kind unknown", TRAINJOB, m_set(["spec", "runtimeRef", "kind"], "JobSet"),
     "runtimeRef.kind must be", "$.spec.runtimeRef.kind"),
    ("numProcPerNode zero", TRAINJOB, m_set(["spec", "trainer", "numProcPerNode"], 0),
     "numProcPerNode must be >= 1", "$.spec.trainer.numProcPerNode"),
    ("numNodes beyond int32", TRAINJOB, m_set(["spec", "trainer", "numNodes"], 2 ** 31),
     "out of range for int32", "$.spec.trainer.numNodes"),
    ("label key invalid", TRAINJOB, m_set(["metadata", "labels"], {"-bad": "x"}),
     "invalid label key '-bad'", "$.metadata.labels"),
    ("label value too long", TRAINJOB, m_set(["metadata", "labels"], {"kueue.x-k8s.io/queue-name":
                                                                       "q" * 64}),
     "no more than 63 characters", "$.metadata.labels"),
    ("label value not a string", TRAINJOB, m_set(["metadata", "labels"], {"team": True}),
     "must be a string", "$.metadata.labels.team"),
    ("label value bad chars in patch template", TRAINJOB,
     m_set(["spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "metadata", "labels",
            "team"], "ml platform"),
     "label value 'ml platform'", "$.spec.runtimePatches[0]"),
    ("annotation key invalid", TRAINJOB, m_set(["metadata", "annotations"], {"a/b/c": "x"}),
     "invalid annotation key", "$.metadata.annotations"),
    ("unknown metadata field", TRAINJOB, m_set(["metadata", "nmae"], "x"),
     "unknown field metadata.nmae", "$.metadata"),
    ("missing metadata.name", TRAINJOB, m_del(["metadata", "name"]),
     "metadata.name is required", "$.metadata"),
    ("MPIJob Launcher replicas 2", MPIJOB,
     m_set(["spec", "mpiReplicaSpecs", "Launcher", "replicas"], 2),
     "Launcher replicas must be 1", "$.spec.mpiReplicaSpecs.Launcher.replicas"),
    ("MPIJob launcherCreationPolicy Sometimes", MPIJOB,
     m_set(["spec", "launcherCreationPolicy"], "Sometimes"),
     "launcherCreationPolicy must be one of AtStartup, WaitForWorkersReady",
     "$.spec.launcherCreationPolicy"),
    ("MPIJob cleanPodPolicy Maybe", MPIJOB, m_set(["spec", "runPolicy", "cleanPodPolicy"], "Maybe"),
     "cleanPodPolicy must be one of None, Running, All", "$.spec.runPolicy.cleanPodPolicy"),
    ("MPIJob restartPolicy Always", MPIJOB,
     m_set(["spec", "mpiReplicaSpecs", "Worker", "restartPolicy"], "Always"),
     "restartPolicy must be one of Never, OnFailure", "$.spec.mpiReplicaSpecs.Worker.restartPolicy"),
    ("MPIJob replica type Master", MPIJOB,
     lambda d: d["spec"]["mpiReplicaSpecs"].__setitem__(
         "Master", copy.deepcopy(d["spec"]["mpiReplicaSpecs"]["Worker"])),
     "mpiReplicaSpecs key must be Launcher or Worker", "$.spec.mpiReplicaSpecs.Master"),
    ("MPIJob Launcher missing", MPIJOB, m_del(["spec", "mpiReplicaSpecs", "Launcher"]),
     "mpiReplicaSpecs.Launcher is required", "$.spec.mpiReplicaSpecs"),
    ("MPIJob Worker replicas 0", MPIJOB, m_set(["spec", "mpiReplicaSpecs", "Worker", "replicas"], 0),
     "Worker replicas must be >= 1", "$.spec.mpiReplicaSpecs.Worker.replicas"),
    ("MPIJob Worker replicas defaulted to 0", MPIJOB,
     m_del(["spec", "mpiReplicaSpecs", "Worker", "replicas"]),
     "Worker replicas must be >= 1 (got 0)", "$.spec.mpiReplicaSpecs.Worker.replicas"),
    ("MPIJob worker name too long", MPIJOB,
     lambda d: (m_name(55)(d), d["spec"]["mpiReplicaSpecs"]["Worker"].__setitem__("replicas", 10)),
     "derived name '%s-worker-9'" % ("a" * 55), "$.metadata.name"),
    ("MPIJob name with dot", MPIJOB, m_set(["metadata", "name"], "pi.v2"),
     "RFC 1035 DNS label", "$.metadata.name"),
    ("MPIJob null required field", MPIJOB, m_set(["spec", "mpiReplicaSpecs"], None),
     "'mpiReplicaSpecs' is a required property", "$.spec"),
    ("runtime without framework label", TORCH_RT, m_set(["metadata", "labels"], {}),
     "trainer.kubeflow.org/framework", "$.metadata.labels"),
    ("runtime with two mlPolicy sources", TORCH_RT,
     m_set(["spec", "mlPolicy", "mpi"], {"numProcPerNode": 1}),
     "only one of the policy can be configured", "$.spec.mlPolicy"),
    ("runtime envInjection lists node", TORCH_RT,
     m_set(["spec", "mlPolicy", "torch", "envInjection"],
           {"targets": [{"jobName": "node", "containerNames": ["node"]}]}),
     "must not include the main node container", "$.spec.mlPolicy.torch.envInjection"),
    ("runtime trainer job replicas 2", TORCH_RT,
     lambda d: rt_job(d, "node").__setitem__("replicas", 2),
     "must have replicas: 1", "$.spec.template.spec.replicatedJobs[0].replicas"),
    ("runtime trainer job renamed", TORCH_RT,
     lambda d: rt_job(d, "node").__setitem__("name", "trainer"),
     "runtime must have a replicated job named 'node'", "$.spec.template.spec.replicatedJobs"),
    ("runtime trainer container renamed", TORCH_RT,
     lambda d: rt_container(d, "node").__setitem__("name", "pytorch"),
     "must have a container named 'node'", "$.spec.template.spec.replicatedJobs[0]"),
    ("runtime trainer job unlabelled", TORCH_RT,
     lambda d: rt_job(d, "node")["template"].pop("metadata"),
     "must carry label trainer.kubeflow.org/trainjob-ancestor-step: trainer",
     "$.spec.template.spec.replicatedJobs[0]"),
    ("MPI runtime without launcher", MPI_RT,
     lambda d: d["spec"]["template"]["spec"].__setitem__(
         "replicatedJobs", [rt_job(d, "node")]),
     "replicated job named 'launcher'", "$.spec.template.spec.replicatedJobs"),
    ("runtime dependsOn unknown job", MPI_RT,
     lambda d: rt_job(d, "launcher")["dependsOn"][0].__setitem__("name", "worker"),
     "dependsOn must name another replicated job", "$.spec.template.spec.replicatedJobs[1]"),
    ("runtime torch.numProcPerNode (removed in v2.2)", TORCH_RT,
     m_set(["spec", "mlPolicy", "torch", "numProcPerNode"], "auto"),
     "'numProcPerNode' was unexpected", "$.spec.mlPolicy.torch"),
    ("unknown kind", TRAINJOB, m_set(["kind"], "PyTorchJob"), "unknown kind 'PyTorchJob'", "$"),
    ("unknown apiVersion", TRAINJOB, m_set(["apiVersion"], "kubeflow.org/v1"),
     "unknown kind 'TrainJob' with apiVersion 'kubeflow.org/v1'", "$"),
]


def test_negatives():
    for base, label in ((TRAINJOB, "TrainJob"), (MPIJOB, "MPIJob"), (TORCH_RT, "torch runtime"),
                        (MPI_RT, "MPI runtime")):
        lines = problems_of(base)
        report("base %s is valid" % label, not lines, "; ".join(lines))
    for case, base, mutate, fragment, path in NEGATIVES:
        doc = copy.deepcopy(base)
        mutate(doc)
        lines = problems_of(doc)
        hits = [line for line in lines if fragment in line and
                (path is None or (": %s" % path) in line)]
        report("rejects %s" % case, bool(hits),
               "expected %r at %s; got: %s" % (fragment, path, " | ".join(lines) or "no problems"))


def test_edge_positives():
    """Valid variations that a too-strict validator would reject."""
    cases = []
    # budget boundary: 47 characters and 100 nodes fit (63 - len("-node-0-99-abcde"))
    doc = copy.deepcopy(TRAINJOB)
    m_numnodes_name(47, 100)(doc)
    cases.append(("TrainJob name of 47 chars with 100 nodes", [doc]))
    # Kueue / MultiKueue TrainJob
    doc = copy.deepcopy(TRAINJOB)
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "training-queue"}
    doc["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    doc["spec"]["suspend"] = True
    doc["spec"]["trainer"]["numProcPerNode"] = 8
    doc["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": 8, "cpu": "500m",
                                                             "memory": "1.5Gi"}}
    cases.append(("TrainJob with Kueue labels, managedBy, GPUs", [doc]))
    # patch time is a timestamp: must stay a string (no YAML timestamp conversion)
    text = ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: t}\n"
            "spec:\n  runtimeRef: {name: torch-distributed}\n  runtimePatches:\n"
            "  - manager: example.com/kft\n    time: 2024-01-02T03:04:05Z\n")
    cases.append(("runtimePatches time stays a string",
                  [d.data for d in validate.load_documents(text, "<t>")]))
    # a TrainJob resolving its TrainingRuntime from the same input
    rt = copy.deepcopy(TORCH_RT)
    rt["kind"] = "TrainingRuntime"
    rt["metadata"]["name"] = "my-rt"
    rt_job(rt, "node")["replicas"] = 1
    tj = copy.deepcopy(TRAINJOB)
    tj["spec"]["runtimeRef"] = {"kind": "TrainingRuntime", "name": "my-rt"}
    cases.append(("TrainJob + TrainingRuntime in one stream", [rt, tj]))
    # MPIJob with policies, ports differing only by protocol
    mj = copy.deepcopy(MPIJOB)
    mj["spec"]["launcherCreationPolicy"] = "WaitForWorkersReady"
    mj["spec"]["runPolicy"]["cleanPodPolicy"] = "All"
    mj["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    mj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"] = [
        {"containerPort": 2222}, {"containerPort": 2222, "protocol": "UDP"}]
    cases.append(("MPIJob with policies and ports", [mj]))
    # launcher-only MPIJob (Worker is optional)
    solo = copy.deepcopy(MPIJOB)
    del solo["spec"]["mpiReplicaSpecs"]["Worker"]
    cases.append(("MPIJob without Worker", [solo]))
    # longest allowed MPIJob name for 10 workers: <name>-worker-9 is 63 characters
    edge = copy.deepcopy(MPIJOB)
    m_name(54)(edge)
    edge["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 10
    cases.append(("MPIJob name of 54 chars with 10 workers", [edge]))
    for name, datas in cases:
        lines = problems_of(*datas)
        report("accepts %s" % name, not lines, "; ".join(lines))

    # duplicate ports (same containerPort, protocol defaulted to TCP) are a list-map clash
    mj2 = copy.deepcopy(mj)
    mj2["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"] = [
        {"containerPort": 2222}, {"containerPort": 2222, "protocol": "TCP"}]
    lines = problems_of(mj2)
    report("rejects duplicate port with defaulted protocol",
           any("duplicate entry for list-map key containerPort=2222" in l for l in lines),
           "; ".join(lines))
    # duplicate YAML mapping key
    docs = validate.load_documents("apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\nkind: MPIJob\n",
                                   "<t>")
    report("reports duplicate YAML keys", bool(docs) and any(
        "duplicate key 'kind'" in m for _, m in docs[0].problems), repr(docs and docs[0].problems))


# --------------------------------------------------------------------------------------------
# (c) command line
# --------------------------------------------------------------------------------------------

def run_cli(args, stdin=None, env=None):
    proc = subprocess.run([sys.executable, VALIDATE_PY] + args, input=stdin,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def test_cli():
    files = sorted(glob.glob(os.path.join(SCHEMAS, "runtimes", "*.yaml")) +
                   glob.glob(os.path.join(SCHEMAS, "examples", "*", "*.yaml")))
    rc, out, err = run_cli(["--schemas", SCHEMAS] + files)
    report("cli: upstream files exit 0 with ok line", rc == 0 and re.search(
        r"^ok: \d+ document\(s\)$", out, re.M) is not None, "rc=%d out=%s err=%s" % (rc, out, err))

    import yaml
    bad = copy.deepcopy(TRAINJOB)
    bad["metadata"]["name"] = "Bad"
    bad["spec"]["trainer"]["numProcPerNode"] = "auto"
    stream = yaml.safe_dump(MPIJOB) + "---\n" + yaml.safe_dump(bad)
    env = dict(os.environ, KFT_SCHEMAS_DIR=SCHEMAS)
    rc, out, err = run_cli(["-"], stdin=stream, env=env)
    lines = out.splitlines()
    fmt = re.compile(r"^<stdin>: doc 2 \(TrainJob Bad\): \$[^ ]*: .+")
    report("cli: stdin with problems exits 1, one formatted line each",
           rc == 1 and len(lines) == 2 and all(fmt.match(l) for l in lines),
           "rc=%d out=%r" % (rc, out))

    rc, out, err = run_cli(["--schemas", SCHEMAS, "/nonexistent/file.yaml"])
    report("cli: missing file exits 2", rc == 2, "rc=%d err=%s" % (rc, err))
    rc, out, err = run_cli(["--schemas", SCHEMAS, "-"], stdin="a: [b\n")
    report("cli: unparsable YAML exits 2", rc == 2 and "cannot parse YAML" in err,
           "rc=%d err=%s" % (rc, err))
    rc, out, err = run_cli([])
    report("cli: no arguments exits 2", rc == 2, "rc=%d" % rc)
    rc, out, err = run_cli(["--schemas", "/nonexistent-schemas", "-"], stdin=yaml.safe_dump(MPIJOB))
    report("cli: missing schemas dir exits 2", rc == 2, "rc=%d err=%s" % (rc, err))
    rc, out, err = run_cli(["--schemas", SCHEMAS, "-"], stdin="# only a comment\n")
    report("cli: empty input exits 2", rc == 2, "rc=%d err=%s" % (rc, err))


def main():
    for test in (test_upstream_documents, test_schema_conversion, test_negatives,
                 test_edge_positives, test_cli):
        try:
            test()
        except Exception as exc:  # a crash is a failure, keep going
            import traceback
            traceback.print_exc()
            report(test.__name__ + " crashed", False, repr(exc))
    print("test_validator: %d passed, %d failed" % (RESULTS["passed"], RESULTS["failed"]))
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
