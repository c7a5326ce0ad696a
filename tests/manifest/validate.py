#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Offline validator for Kubeflow TrainJob / (Cluster)TrainingRuntime / MPIJob manifests.

Usage:
    /usr/bin/python3 tests/manifest/validate.py [--schemas DIR] FILE...

FILE may be "-" for standard input; every file may hold several YAML documents
separated by "---".  Each document is checked in two stages:

1. JSON Schema: the matching CRD version's openAPIV3Schema (from the schemas
   directory) is converted to a Draft 7 JSON Schema (structural-schema rules
   below, "CRD -> JSON Schema") and the document (with null values
   dropped, as the API server prunes them) is validated against it.  Every
   error is reported with its JSON path.

2. Hand-written checks for what JSON Schema cannot express: list-map key and
   list-set uniqueness, int32/int64 ranges, object names, label/annotation
   syntax, the CRDs' CEL rules (create-time ones), and the admission-webhook /
   controller rules of Kubeflow Trainer, JobSet and mpi-operator that matter
   for generated manifests (reserved env names, pod-name length budget,
   runtime structure, MPIJob enums the CRD leaves open ...).

Output: one line per problem, "FILE: doc N (Kind name): path: message".
Exit status: 0 all documents valid ("ok: N document(s)"), 1 some problem,
2 usage error (unreadable file, unparsable YAML, missing schemas/modules).

The schemas directory defaults to tests/manifest/schemas (upstream copies, see
its SOURCES.md) and can be overridden with --schemas or the KFT_SCHEMAS_DIR environment variable.  Its
runtimes/ subdirectory (the default ClusterTrainingRuntimes) is used, together
with any runtime documents given on the command line, to resolve a TrainJob's
runtimeRef for the checks that need the runtime (see check_trainjob).
"""

import argparse
import glob
import json
import os
import re
import sys

try:
    import yaml
    import jsonschema
except ImportError as exc:  # pragma: no cover - environment problem
    sys.stderr.write("validate.py: missing Python module (%s); install python3-yaml and "
                     "python3-jsonschema (apt) and run with /usr/bin/python3\n" % exc)
    sys.exit(2)

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
MPI_API = "kubeflow.org/v2beta1"

# The kinds this validator knows, by (apiVersion, kind).
SUPPORTED_KINDS = {
    (TRAINER_API, "TrainJob"),
    (TRAINER_API, "TrainingRuntime"),
    (TRAINER_API, "ClusterTrainingRuntime"),
    (MPI_API, "MPIJob"),
}
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")

# Kubernetes name syntax (k8s.io/apimachinery/pkg/util/validation).
DNS1035_LABEL_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME_PART_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Path part of a domain-prefixed path (validation.IsDomainPrefixedPath).
DOMAIN_PATH_PART_RE = re.compile(r"^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")
MAX_LABEL_LEN = 63
MAX_SUBDOMAIN_LEN = 253
MAX_ANNOTATIONS_BYTES = 256 * 1024

# Fields of ObjectMeta (top-level metadata is only "type: object" in the CRDs).
OBJECT_META_FIELDS = {
    "name", "generateName", "namespace", "labels", "annotations", "finalizers",
    "ownerReferences", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink",
}

# Kubeflow Trainer (pkg/constants, webhooks) -------------------------------------------------
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
# ancestor-step label value -> container name the runtime webhook requires in that job
ANCESTOR_CONTAINERS = {
    "trainer": "node",
    "dataset-initializer": "dataset-initializer",
    "model-initializer": "model-initializer",
}
TRAINJOB_MANAGED_BY = ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")
STORAGE_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
ML_POLICY_SOURCES = ("torch", "mpi", "jax", "xgboost", "flux")
# Env names the Trainer webhook reserves in spec.trainer.env (torch PET_*, MPI OMPI_MCA_*,
# XGBoost DMLC_*).  Any PET_ / OMPI_MCA_ name is rejected: they are torchrun / OpenMPI
# control variables and the controller owns them.
RESERVED_ENV_PREFIXES = ("PET_", "OMPI_MCA_")
RESERVED_ENV_NAMES = {
    "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
    "OMPI_MCA_orte_default_hostfile", "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots", "OMPI_MCA_plm_rsh_args",
    "DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER",
}
# Containers whose env a runtimePatch may not set (use trainer.env / initializer.*.env).
NO_PATCH_ENV_CONTAINERS = ("node", "dataset-initializer", "model-initializer")
# JobSet pod names get a random 5-character suffix.
POD_SUFFIX = "-abcde"

# mpi-operator (pkg/apis/kubeflow/validation) ----------------------------------------------
MPI_LAUNCHER_CREATION_POLICIES = ("AtStartup", "WaitForWorkersReady")
MPI_CLEAN_POD_POLICIES = ("None", "Running", "All")
MPI_RESTART_POLICIES = ("Never", "OnFailure")
MPI_REPLICA_TYPES = ("Launcher", "Worker")
MPI_MANAGED_BY = ("kubeflow.org/mpi-operator", "kueue.x-k8s.io/multikueue")

INT32 = (-2 ** 31, 2 ** 31 - 1)
INT64 = (-2 ** 63, 2 ** 63 - 1)


class UsageError(Exception):
    """Unreadable input, unparsable YAML, or missing schemas: exit status 2."""


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------

def fmt_path(tokens):
    """Format a list of keys/indices as a JSON path: $.spec.trainer.env[0].name,
    $.metadata.labels['trainer.kubeflow.org/framework']."""
    out = "$"
    for tok in tokens:
        if isinstance(tok, int):
            out += "[%d]" % tok
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(tok)):
            out += "." + str(tok)
        else:
            out += "['%s']" % str(tok).replace("'", "\\'")
    return out


def get(obj, *keys):
    """Walk nested mappings; None when a key is missing or a value has the wrong type."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def as_list(value):
    return value if isinstance(value, list) else []


def as_dict(value):
    return value if isinstance(value, dict) else {}


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def drop_nulls(value):
    """Remove null mapping values recursively (the API server prunes them before
    validating, e.g. `command:` with no value in upstream pi-intel.yaml)."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def shorten(text, limit=300):
    """Keep messages readable when jsonschema embeds a whole object in them."""
    if len(text) <= limit:
        return text
    return text[:limit - 90] + " ... " + text[-85:]


def named_items(items):
    """(index, name, item) for the mapping items of a list that have a string name."""
    for i, item in enumerate(as_list(items)):
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            yield i, item["name"], item


def pod_containers(pod_spec):
    """Names of containers and initContainers of a pod spec."""
    names = set()
    for field in ("containers", "initContainers"):
        names.update(name for _, name, _ in named_items(get(pod_spec, field)))
    return names


def check_dns1035_label(value, what):
    """Message for an invalid RFC 1035 label, or None."""
    if len(value) > MAX_LABEL_LEN:
        return "%s '%s' must be no more than 63 characters (has %d)" % (what, value, len(value))
    if not DNS1035_LABEL_RE.match(value):
        return ("%s '%s' must be an RFC 1035 DNS label: lowercase letters, digits and '-', "
                "starting with a letter and ending with a letter or digit "
                "(regex ^[a-z]([-a-z0-9]*[a-z0-9])?$)" % (what, value))
    return None


def check_dns1123_subdomain(value, what):
    if len(value) > MAX_SUBDOMAIN_LEN:
        return "%s '%s' must be no more than 253 characters" % (what, value)
    if not DNS1123_SUBDOMAIN_RE.match(value):
        return ("%s '%s' must be an RFC 1123 subdomain: lowercase letters, digits, '-' and '.', "
                "starting and ending with a letter or digit" % (what, value))
    return None


def check_qualified_name(key):
    """Messages for an invalid label/annotation key ([prefix/]name, IsQualifiedName)."""
    problems = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            problems.append("key '%s': prefix part must be non-empty" % key)
        else:
            msg = check_dns1123_subdomain(prefix, "key prefix")
            if msg:
                problems.append("key '%s': %s" % (key, msg))
    else:
        return ["key '%s': a qualified name must consist of an optional DNS subdomain prefix "
                "and '/' and a name" % key]
    if not name:
        problems.append("key '%s': name part must be non-empty" % key)
    elif len(name) > MAX_LABEL_LEN:
        problems.append("key '%s': name part must be no more than 63 characters" % key)
    elif not QUALIFIED_NAME_PART_RE.match(name):
        problems.append("key '%s': name part must consist of alphanumerics, '-', '_' or '.', "
                        "starting and ending with an alphanumeric character" % key)
    return problems


def domain_prefixed_path_problem(value):
    """Message when `value` is not '<domain>/<path>' with a dotted DNS-subdomain domain."""
    if "/" not in value:
        return "must be a domain-prefixed path such as 'example.com/kft' (no '/')"
    domain, path = value.split("/", 1)
    if "." not in domain:
        return ("must be a domain-prefixed path such as 'example.com/kft' "
                "(prefix '%s' is not a domain)" % domain)
    msg = check_dns1123_subdomain(domain, "domain prefix")
    if msg:
        return msg
    if not path or not DOMAIN_PATH_PART_RE.match(path):
        return "must be a domain-prefixed path such as 'example.com/kft' (invalid path part)"
    return None


# --------------------------------------------------------------------------------------------
# YAML loading
# --------------------------------------------------------------------------------------------

class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps timestamps as strings (Kubernetes fields are strings)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _duplicate_keys(node, path, out):
    """Collect duplicate mapping keys (kubectl's strict decoding rejects them; PyYAML
    silently keeps the last one)."""
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for knode, vnode in node.value:
            if isinstance(knode, yaml.ScalarNode) and knode.tag != "tag:yaml.org,2002:merge":
                key = knode.value
                if key in seen:
                    out.append((path + [key], "duplicate key '%s' (lines %d and %d)"
                                % (key, seen[key] + 1, knode.start_mark.line + 1)))
                else:
                    seen[key] = knode.start_mark.line
                _duplicate_keys(vnode, path + [key], out)
            else:
                _duplicate_keys(vnode, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            _duplicate_keys(child, path + [i], out)


class Document(object):
    """One YAML document of an input file."""

    def __init__(self, label, index, data, problems=None):
        self.label = label          # file name as given ("<stdin>" for -)
        self.index = index          # 1-based position in the file's YAML stream
        self.data = data
        self.problems = list(problems or [])   # [(path tokens, message)]

    @property
    def kind(self):
        return self.data.get("kind") if isinstance(self.data, dict) else None

    @property
    def name(self):
        return get(self.data, "metadata", "name")

    def add(self, path, message):
        self.problems.append((list(path), message))

    def lines(self):
        kind = self.kind if isinstance(self.kind, str) else "?"
        name = self.name if isinstance(self.name, str) else "?"
        head = "%s: doc %d (%s %s)" % (self.label, self.index, kind, name)
        return ["%s: %s: %s" % (head, fmt_path(p), m) for p, m in self.problems]


def load_documents(text, label):
    """Parse a YAML stream into Documents (empty documents are skipped).
    Raises UsageError on a YAML syntax error."""
    docs = []
    loader = _Loader(text)
    loader.name = label         # shown in YAML error marks
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            index += 1
            if node is None:
                continue
            dups = []
            _duplicate_keys(node, [], dups)
            data = loader.construct_document(node)
            if data is None:
                continue        # a document holding only comments
            docs.append(Document(label, index, data, dups))
    except yaml.YAMLError as exc:
        raise UsageError("%s: cannot parse YAML: %s" % (label, " ".join(str(exc).split())))
    finally:
        loader.dispose()
    return docs


def read_input(path):
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        with open(path, "r", encoding="utf-8") as fh:
            return fh.read(), path
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError("%s: cannot read: %s" % (path, exc))


# --------------------------------------------------------------------------------------------
# CRD -> JSON Schema (the API server's structural-schema rules)
# --------------------------------------------------------------------------------------------

def convert_schema(node, top_level=False):
    """Convert a structural OpenAPI v3 schema (CRD openAPIV3Schema) into Draft 7 JSON Schema.

    1. drop `description` and every `x-kubernetes-*` key;
    2. `x-kubernetes-int-or-string: true` -> `anyOf: [integer, string]` without `type`; a
       `pattern` stays beside it, where JSON Schema applies it to strings only;
    3. `nullable: true` -> `type: [T, "null"]`;
    4. `additionalProperties: false` on every object with `properties`, no
       `additionalProperties` and no `x-kubernetes-preserve-unknown-fields` (strict field
       validation rejects unknown fields; this is what catches removed/misspelt fields);
    5. top-level `metadata` stays `type: object` (checked by hand).
    OpenAPI `format`s are kept as annotations (no format checker is used); int32/int64
    ranges are checked by StructuralChecker.
    """
    if isinstance(node, list):
        return [convert_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "description" or key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {}
            for name, sub in value.items():
                if top_level and name == "metadata":
                    out[key][name] = {"type": "object"}
                else:
                    out[key][name] = convert_schema(sub)
        elif key in ("items", "additionalProperties", "not"):
            out[key] = convert_schema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [convert_schema(item) for item in value]
        else:
            out[key] = value          # type, enum, pattern, required, min*/max*, default ...
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


class CRDSet(object):
    """The CRDs of the schemas directory, indexed by (apiVersion, kind)."""

    def __init__(self, schemas_dir):
        self.schemas_dir = schemas_dir
        self.raw = {}           # (apiVersion, kind) -> openAPIV3Schema as in the CRD
        self._validators = {}
        if not os.path.isdir(schemas_dir):
            raise UsageError("schemas directory not found: %s (use --schemas or KFT_SCHEMAS_DIR)"
                             % schemas_dir)
        fast_loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        for path in sorted(glob.glob(os.path.join(schemas_dir, "*.yaml"))):
            try:
                with open(path, "r", encoding="utf-8") as fh:
                    crds = list(yaml.load_all(fh, Loader=fast_loader))
            except (OSError, yaml.YAMLError) as exc:
                raise UsageError("cannot load CRD file %s: %s" % (path, exc))
            for crd in crds:
                if get(crd, "kind") != "CustomResourceDefinition":
                    continue
                group = get(crd, "spec", "group")
                kind = get(crd, "spec", "names", "kind")
                for version in as_list(get(crd, "spec", "versions")):
                    schema = get(version, "schema", "openAPIV3Schema")
                    if isinstance(schema, dict) and version.get("served", True):
                        self.raw[("%s/%s" % (group, version.get("name")), kind)] = schema

    def has(self, api_version, kind):
        return (api_version, kind) in self.raw

    def validator(self, api_version, kind):
        key = (api_version, kind)
        if key not in self._validators:
            schema = convert_schema(self.raw[key], top_level=True)
            self._validators[key] = jsonschema.Draft7Validator(schema)
        return self._validators[key]


class StructuralChecker(object):
    """Checks the CRD schema expresses with x-kubernetes-* keys and formats that JSON Schema
    does not: list-map key uniqueness (env names, containers, replicatedJobs, runtimePatches
    managers, ports ...), list-set uniqueness, int32/int64 ranges.  Walks the raw CRD schema
    alongside the document."""

    def __init__(self, doc):
        self.doc = doc

    def walk(self, schema, value, path):
        if not isinstance(schema, dict):
            return
        if isinstance(value, list):
            self._unique(schema, value, path)
            items = schema.get("items")
            if isinstance(items, dict):
                for i, item in enumerate(value):
                    self.walk(items, item, path + [i])
        elif isinstance(value, dict):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties")
            for key, sub in value.items():
                if key in props:
                    self.walk(props[key], sub, path + [key])
                elif isinstance(extra, dict):
                    self.walk(extra, sub, path + [key])
        elif is_int(value):
            rng = {"int32": INT32, "int64": INT64}.get(schema.get("format"))
            if rng and not rng[0] <= value <= rng[1]:
                self.doc.add(path, "%d is out of range for %s" % (value, schema["format"]))

    def _unique(self, schema, items, path):
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "map":
            keys = schema.get("x-kubernetes-list-map-keys") or []
            item_props = get(schema, "items", "properties") or {}
            seen = {}
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    continue
                # A missing key field takes its schema default (e.g. ports[].protocol=TCP).
                ident = tuple(json.dumps(item.get(k, get(item_props, k, "default")), sort_keys=True)
                              for k in keys)
                if ident in seen:
                    desc = ", ".join("%s=%s" % (k, v) for k, v in zip(keys, ident))
                    self.doc.add(path + [i], "duplicate entry for list-map key %s (also at index %d)"
                                 % (desc, seen[ident]))
                else:
                    seen[ident] = i
        elif list_type == "set":
            seen = {}
            for i, item in enumerate(items):
                ident = json.dumps(item, sort_keys=True)
                if ident in seen:
                    self.doc.add(path + [i], "duplicate value %s in a set (also at index %d)"
                                 % (ident, seen[ident]))
                else:
                    seen[ident] = i


# --------------------------------------------------------------------------------------------
# Metadata checks (all kinds)
# --------------------------------------------------------------------------------------------

def check_string_map(doc, mapping, path, what):
    """labels/annotations must map strings to strings; returns the valid string pairs."""
    pairs = []
    if not isinstance(mapping, dict):
        doc.add(path, "%s must be a mapping of strings to strings" % what)
        return pairs
    for key, value in mapping.items():
        if not isinstance(key, str):
            doc.add(path, "%s key %r must be a string" % (what, key))
        elif not isinstance(value, str):
            doc.add(path + [key], "%s value %r must be a string (quote it)" % (what, value))
        else:
            pairs.append((key, value))
    return pairs


def check_labels_annotations(doc, meta, path):
    """Label and annotation syntax of one ObjectMeta (top-level or embedded template)."""
    if "labels" in meta:
        for key, value in check_string_map(doc, meta["labels"], path + ["labels"], "label"):
            for msg in check_qualified_name(key):
                doc.add(path + ["labels", key], "invalid label " + msg)
            if len(value) > MAX_LABEL_LEN:
                doc.add(path + ["labels", key], "label value '%s' must be no more than 63 characters"
                        % value)
            elif not LABEL_VALUE_RE.match(value):
                doc.add(path + ["labels", key],
                        "label value '%s' must be empty or consist of alphanumerics, '-', '_' or "
                        "'.', starting and ending with an alphanumeric character" % value)
    if "annotations" in meta:
        total = 0
        for key, value in check_string_map(doc, meta["annotations"], path + ["annotations"],
                                           "annotation"):
            total += len(key) + len(value)
            for msg in check_qualified_name(key):
                doc.add(path + ["annotations", key], "invalid annotation " + msg)
        if total > MAX_ANNOTATIONS_BYTES:
            doc.add(path + ["annotations"], "annotations total size %d exceeds 262144 bytes" % total)


def check_all_metadata(doc, value, path):
    """Label/annotation syntax of every `metadata` object in the document (the JobSet, Job
    and Pod templates carry labels that end up on real objects)."""
    if isinstance(value, dict):
        for key, sub in value.items():
            if key == "metadata" and isinstance(sub, dict) and path:
                check_labels_annotations(doc, sub, path + [key])
            check_all_metadata(doc, sub, path + [key])
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            check_all_metadata(doc, sub, path + [i])


def check_top_metadata(doc, name_rule):
    """Top-level ObjectMeta (the CRDs only say `type: object`).  name_rule is
    'dns1035' (TrainJob CEL, MPIJob derived names) or 'subdomain' (generic ObjectMeta)."""
    meta = doc.data.get("metadata")
    if meta is None:
        doc.add([], "metadata is required")
        return
    if not isinstance(meta, dict):
        doc.add(["metadata"], "metadata must be a mapping")
        return
    for key in meta:
        if key not in OBJECT_META_FIELDS:
            doc.add(["metadata"], "unknown field metadata.%s" % key)
    name = meta.get("name")
    if name is None:
        if not isinstance(meta.get("generateName"), str):
            doc.add(["metadata"], "metadata.name is required")
    elif not isinstance(name, str):
        doc.add(["metadata", "name"], "metadata.name must be a string")
    else:
        if name_rule == "dns1035":
            msg = check_dns1035_label(name, "metadata.name")
        else:
            msg = check_dns1123_subdomain(name, "metadata.name")
        if msg:
            doc.add(["metadata", "name"], msg)
    namespace = meta.get("namespace")
    if namespace is not None:
        if not isinstance(namespace, str) or len(namespace) > MAX_LABEL_LEN \
                or not DNS1123_LABEL_RE.match(namespace):
            doc.add(["metadata", "namespace"], "metadata.namespace %r must be an RFC 1123 DNS label"
                    % (namespace,))
    check_labels_annotations(doc, meta, ["metadata"])


def effective_name(doc):
    """metadata.name, or generateName plus a 5-character random suffix, or None."""
    name = get(doc.data, "metadata", "name")
    if isinstance(name, str):
        return name
    prefix = get(doc.data, "metadata", "generateName")
    return prefix + "xxxxx" if isinstance(prefix, str) else None


# --------------------------------------------------------------------------------------------
# TrainingRuntime / ClusterTrainingRuntime
# --------------------------------------------------------------------------------------------

def runtime_jobs(runtime_spec):
    """{name: (index, replicatedJob)} of a runtime spec's JobSet template."""
    return {name: (i, job) for i, name, job in
            named_items(get(runtime_spec, "template", "spec", "replicatedJobs"))}


def job_pod_spec(job):
    return get(job, "template", "spec", "template", "spec")


def check_runtime(doc):
    spec = as_dict(doc.data.get("spec"))
    labels = as_dict(get(doc.data, "metadata", "labels"))
    if not labels.get(FRAMEWORK_LABEL):
        doc.add(["metadata", "labels"], "runtime must carry label %s (torch, deepspeed, mlx, jax, "
                "xgboost, ...)" % FRAMEWORK_LABEL)

    # mlPolicy CEL rules
    ml = as_dict(spec.get("mlPolicy"))
    sources = [s for s in ML_POLICY_SOURCES if s in ml]
    if len(sources) > 1:
        doc.add(["spec", "mlPolicy"], "only one of the policy can be configured (found %s)"
                % ", ".join(sources))
    if is_int(get(ml, "flux", "numProcPerNode")) and ml["flux"]["numProcPerNode"] < 1:
        doc.add(["spec", "mlPolicy", "flux", "numProcPerNode"], "numProcPerNode must be >= 1")
    if is_int(get(ml, "mpi", "numProcPerNode")) and ml["mpi"]["numProcPerNode"] < 1:
        doc.add(["spec", "mlPolicy", "mpi", "numProcPerNode"], "numProcPerNode must be >= 1")

    jobs = runtime_jobs(spec)
    rjobs_path = ["spec", "template", "spec", "replicatedJobs"]

    # envInjection targets: `node` is never listed; targets must exist
    for t, target in enumerate(as_list(get(ml, "torch", "envInjection", "targets"))):
        tpath = ["spec", "mlPolicy", "torch", "envInjection", "targets", t]
        if not isinstance(target, dict):
            continue
        for c, cname in enumerate(as_list(target.get("containerNames"))):
            if cname == "node":
                doc.add(tpath + ["containerNames", c], "containerNames must not include the main "
                        "node container because PET_* envs are always injected into it")
        job_name = target.get("jobName")
        if isinstance(job_name, str):
            if job_name not in jobs:
                doc.add(tpath + ["jobName"], "replicated job '%s' does not exist" % job_name)
            else:
                present = pod_containers(job_pod_spec(jobs[job_name][1]))
                for c, cname in enumerate(as_list(target.get("containerNames"))):
                    if isinstance(cname, str) and cname != "node" and cname not in present:
                        doc.add(tpath + ["containerNames", c], "container '%s' does not exist in "
                                "replicated job '%s'" % (cname, job_name))

    # JobSet CEL: startupPolicy InOrder and dependsOn are exclusive
    js = as_dict(get(spec, "template", "spec"))
    if get(js, "startupPolicy", "startupPolicyOrder") == "InOrder" and \
            any(isinstance(j, dict) and "dependsOn" in j for _, (_, j) in jobs.items()):
        doc.add(["spec", "template", "spec"], "StartupPolicy and DependsOn APIs are mutually exclusive")
    # JobSet CEL: volumeClaimPolicies templates have no namespace
    for p, policy in enumerate(as_list(js.get("volumeClaimPolicies"))):
        for t, tmpl in enumerate(as_list(get(policy, "templates"))):
            if get(tmpl, "metadata", "namespace"):
                doc.add(["spec", "template", "spec", "volumeClaimPolicies", p, "templates", t,
                         "metadata", "namespace"],
                        "namespace cannot be set for VolumeClaimPolicies templates")

    # References between replicated jobs (JobSet webhook)
    for name, (i, job) in jobs.items():
        for d, dep in enumerate(as_list(job.get("dependsOn"))):
            dname = get(dep, "name")
            if isinstance(dname, str) and (dname not in jobs or dname == name):
                doc.add(rjobs_path + [i, "dependsOn", d, "name"],
                        "dependsOn must name another replicated job ('%s' is not one)" % dname)
    for t, target in enumerate(as_list(get(js, "successPolicy", "targetReplicatedJobs"))):
        if isinstance(target, str) and target not in jobs:
            doc.add(["spec", "template", "spec", "successPolicy", "targetReplicatedJobs", t],
                    "replicated job '%s' does not exist" % target)

    check_failure_rules(doc, spec, jobs)

    # Trainer runtime webhook: ancestor-labelled jobs
    by_step = {}
    for name, (i, job) in sorted(jobs.items(), key=lambda kv: kv[1][0]):
        step = get(job, "template", "metadata", "labels", ANCESTOR_LABEL)
        if step is None:
            continue
        jpath = rjobs_path + [i]
        if step not in ANCESTOR_CONTAINERS:
            doc.add(jpath + ["template", "metadata", "labels", ANCESTOR_LABEL],
                    "unknown %s value '%s' (expected one of %s)"
                    % (ANCESTOR_LABEL, step, ", ".join(sorted(ANCESTOR_CONTAINERS))))
            continue
        if step in by_step:
            doc.add(jpath, "more than one replicated job is labelled %s: %s ('%s' and '%s')"
                    % (ANCESTOR_LABEL, step, by_step[step], name))
        by_step.setdefault(step, name)
        replicas = job.get("replicas", 1)
        if is_int(replicas) and replicas != 1:
            doc.add(jpath + ["replicas"], "replicated job '%s' labelled %s=%s must have replicas: 1 "
                    "(has %d)" % (name, ANCESTOR_LABEL, step, replicas))
        container = ANCESTOR_CONTAINERS[step]
        if container not in pod_containers(job_pod_spec(job)):
            doc.add(jpath, "replicated job '%s' labelled %s=%s must have a container named '%s'"
                    % (name, ANCESTOR_LABEL, step, container))

    # Trainer conventions: trainer job `node` (MPI: `launcher` is the trainer step, and `node`
    # runs sshd); both with a container `node`.
    trainer_job = "launcher" if "mpi" in ml else "node"
    if trainer_job not in jobs:
        doc.add(rjobs_path, "runtime must have a replicated job named '%s'%s"
                % (trainer_job, " (MPI launcher)" if trainer_job == "launcher" else ""))
    else:
        i, job = jobs[trainer_job]
        if get(job, "template", "metadata", "labels", ANCESTOR_LABEL) != "trainer":
            doc.add(rjobs_path + [i, "template", "metadata", "labels"],
                    "replicated job '%s' must carry label %s: trainer" % (trainer_job, ANCESTOR_LABEL))
    if "mpi" in ml:
        if "node" not in jobs:
            doc.add(rjobs_path, "MPI runtime must have a replicated job named 'node'")
        elif "node" not in pod_containers(job_pod_spec(jobs["node"][1])):
            doc.add(rjobs_path + [jobs["node"][0]], "replicated job 'node' must have a container "
                    "named 'node'")


# JobSet's failure policy rule names (its webhook and the CRD's description).
JOBSET_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def check_failure_rules(doc, spec, jobs):
    """JobSet failurePolicy rules and the batch Jobs' podFailurePolicy: what the API server's
    validation (Job) and JobSet's webhook refuse that the CRD schema lets through."""
    fp_path = ["spec", "template", "spec", "failurePolicy"]
    names = {}
    for r, rule in enumerate(as_list(get(spec, "template", "spec", "failurePolicy", "rules"))):
        if not isinstance(rule, dict):
            continue
        rpath = fp_path + ["rules", r]
        name = rule.get("name")
        if isinstance(name, str):
            if not JOBSET_RULE_NAME.match(name):
                doc.add(rpath + ["name"], "rule name '%s' does not match %s" % (name, JOBSET_RULE_NAME.pattern))
            elif name in names:
                doc.add(rpath + ["name"], "rule name '%s' is used twice (first at rules[%d])" % (name, names[name]))
            names.setdefault(name, r)
        for t, target in enumerate(as_list(rule.get("targetReplicatedJobs"))):
            if isinstance(target, str) and target not in jobs:
                doc.add(rpath + ["targetReplicatedJobs", t], "replicated job '%s' does not exist" % target)
        for m, pattern in enumerate(as_list(rule.get("onJobFailureMessagePatterns"))):
            try:
                re.compile(pattern)  # Python's re stands in for Go's RE2 (their common subset)
            except (re.error, TypeError) as exc:
                doc.add(rpath + ["onJobFailureMessagePatterns", m], "not a regular expression: %s" % exc)
    for name, (i, job) in jobs.items():
        jpath = ["spec", "template", "spec", "replicatedJobs", i, "template", "spec"]
        job_spec = as_dict(get(job, "template", "spec"))
        pfp = job_spec.get("podFailurePolicy")
        if not isinstance(pfp, dict):
            continue
        pod_spec = as_dict(job_pod_spec(job))
        if pod_spec.get("restartPolicy") != "Never":
            doc.add(jpath + ["template", "spec", "restartPolicy"],
                    "podFailurePolicy needs the pod's restartPolicy Never, set explicitly (JobSet's webhook "
                    "defaults it to OnFailure; found %s)" % pod_spec.get("restartPolicy", "none"))
        if job_spec.get("podReplacementPolicy") not in (None, "Failed"):
            doc.add(jpath + ["podReplacementPolicy"], "with podFailurePolicy, podReplacementPolicy must be Failed")
        rules = as_list(pfp.get("rules"))
        if len(rules) > 20:
            doc.add(jpath + ["podFailurePolicy", "rules"], "at most 20 rules (has %d)" % len(rules))
        containers = pod_containers(pod_spec)
        for r, rule in enumerate(rules):
            if not isinstance(rule, dict):
                continue
            rpath = jpath + ["podFailurePolicy", "rules", r]
            codes, conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
            if (codes is None) == (conditions is None):
                doc.add(rpath, "exactly one of onExitCodes and onPodConditions is required")
            if rule.get("action") == "FailIndex":
                doc.add(rpath + ["action"], "FailIndex needs backoffLimitPerIndex")
            if isinstance(codes, dict):
                values = as_list(codes.get("values"))
                ints = [v for v in values if is_int(v)]
                if ints != sorted(set(ints)):
                    doc.add(rpath + ["onExitCodes", "values"], "values must be sorted ascending and unique: %s" % values)
                if codes.get("operator") == "In" and 0 in ints:
                    doc.add(rpath + ["onExitCodes", "values"], "value 0 cannot be used with operator In")
                if codes.get("operator") not in ("In", "NotIn"):
                    doc.add(rpath + ["onExitCodes", "operator"], "operator must be In or NotIn")
                cname = codes.get("containerName")
                if isinstance(cname, str) and cname not in containers:
                    doc.add(rpath + ["onExitCodes", "containerName"], "container '%s' does not exist in "
                            "replicated job '%s'" % (cname, name))
            for c, cond in enumerate(as_list(conditions)):
                if isinstance(cond, dict) and cond.get("status", "True") not in ("True", "False", "Unknown"):
                    doc.add(rpath + ["onPodConditions", c, "status"], "status must be True, False or Unknown")


# --------------------------------------------------------------------------------------------
# TrainJob
# --------------------------------------------------------------------------------------------

def reserved_env(name):
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def check_trainjob(doc, runtimes):
    """TrainJob checks.  `runtimes` maps (kind, name) -> runtime document data; when the
    runtimeRef resolves, the runtime's jobs are used for the pod-name budget and the
    runtimePatches / initializer targets."""
    spec = as_dict(doc.data.get("spec"))
    trainer = as_dict(spec.get("trainer"))

    managed_by = spec.get("managedBy")
    if isinstance(managed_by, str) and managed_by not in TRAINJOB_MANAGED_BY:
        doc.add(["spec", "managedBy"], "ManagedBy must be %s or %s if set (got '%s')"
                % (TRAINJOB_MANAGED_BY + (managed_by,)))

    ref = as_dict(spec.get("runtimeRef"))
    ref_kind = ref.get("kind", "ClusterTrainingRuntime")
    if isinstance(ref_kind, str) and ref_kind not in RUNTIME_KINDS:
        doc.add(["spec", "runtimeRef", "kind"], "runtimeRef.kind must be ClusterTrainingRuntime or "
                "TrainingRuntime (got '%s')" % ref_kind)
    api_group = ref.get("apiGroup", "trainer.kubeflow.org")
    if isinstance(api_group, str) and api_group != "trainer.kubeflow.org":
        doc.add(["spec", "runtimeRef", "apiGroup"], "runtimeRef.apiGroup must be "
                "trainer.kubeflow.org (got '%s')" % api_group)

    # Initializer storage URIs (CEL)
    for which in ("dataset", "model"):
        uri = get(spec, "initializer", which, "storageUri")
        if isinstance(uri, str) and uri and not STORAGE_URI_RE.match(uri):
            doc.add(["spec", "initializer", which, "storageUri"], "storageUri may be empty, or it "
                    "must be a valid URI (scheme://...), got '%s'" % uri)

    # Counts (CRD master adds these; a negative or zero count is never meaningful)
    num_nodes = trainer.get("numNodes")
    if is_int(num_nodes) and num_nodes < 0:
        doc.add(["spec", "trainer", "numNodes"], "numNodes must be >= 0")
    nproc = trainer.get("numProcPerNode")
    if is_int(nproc) and nproc < 1:
        doc.add(["spec", "trainer", "numProcPerNode"], "numProcPerNode must be >= 1")

    # Reserved env names (Trainer webhook)
    for i, name, _ in named_items(trainer.get("env")):
        if reserved_env(name):
            doc.add(["spec", "trainer", "env", i, "name"], "env %s is reserved: the Trainer "
                    "controller injects it (PET_*, OMPI_MCA_* and DMLC_* names are rejected in "
                    "trainer.env)" % name)

    # runtimePatches
    runtime = None
    if isinstance(ref.get("name"), str) and isinstance(ref_kind, str):
        runtime = runtimes.get((ref_kind, ref["name"]))
    rt_spec = as_dict(get(runtime, "spec"))
    rt_jobs = runtime_jobs(rt_spec) if runtime is not None else None
    for p, patch in enumerate(as_list(spec.get("runtimePatches"))):
        ppath = ["spec", "runtimePatches", p]
        manager = get(patch, "manager")
        if isinstance(manager, str):
            msg = domain_prefixed_path_problem(manager)
            if msg:
                doc.add(ppath + ["manager"], "runtimePatches manager '%s' %s" % (manager, msg))
        rjobs = get(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs")
        for j, jname, job in named_items(rjobs):
            jpath = ppath + ["trainingRuntimeSpec", "template", "spec", "replicatedJobs", j]
            pod = job_pod_spec(job)
            if rt_jobs is not None and jname not in rt_jobs:
                doc.add(jpath + ["name"], "replicated job '%s' does not exist in %s %s"
                        % (jname, ref_kind, ref["name"]))
            present = pod_containers(job_pod_spec(rt_jobs[jname][1])) \
                if rt_jobs is not None and jname in rt_jobs else None
            for field in ("containers", "initContainers"):
                for c, cname, container in named_items(get(pod, field)):
                    cpath = jpath + ["template", "spec", "template", "spec", field, c]
                    if field == "containers" and cname in NO_PATCH_ENV_CONTAINERS \
                            and "env" in container:
                        doc.add(cpath + ["env"], "runtimePatches may not set env on container '%s' "
                                "(use spec.trainer.env / spec.initializer.*.env)" % cname)
                    if present is not None and cname not in present:
                        doc.add(cpath + ["name"], "container '%s' does not exist in replicated job "
                                "'%s' of %s %s" % (cname, jname, ref_kind, ref["name"]))

    # Initializers need matching runtime jobs
    if rt_jobs is not None:
        steps = {get(job, "template", "metadata", "labels", ANCESTOR_LABEL)
                 for _, job in rt_jobs.values()}
        for which in ("dataset", "model"):
            if get(spec, "initializer", which) is not None and \
                    "%s-initializer" % which not in steps:
                doc.add(["spec", "initializer", which], "%s %s has no %s-initializer job"
                        % (ref_kind, ref["name"], which))

    check_pod_name_budget(doc, trainer, rt_spec if runtime is not None else None)


def check_pod_name_budget(doc, trainer, rt_spec):
    """JobSet rejects a JobSet whose longest pod name <jobset>-<rjob>-<jobIdx>-<podIdx>-xxxxx
    is longer than 63 characters; the JobSet is named after the TrainJob.  Without the
    runtime only the trainer job `node` (numNodes pods) is known."""
    name = effective_name(doc)
    if name is None:
        return
    num_nodes = trainer.get("numNodes")
    if not is_int(num_nodes):
        num_nodes = get(rt_spec, "mlPolicy", "numNodes")
    if not is_int(num_nodes) or num_nodes < 1:
        num_nodes = 1
    if rt_spec is None:
        pods = {"node": (1, num_nodes)}
    else:
        mpi = get(rt_spec, "mlPolicy", "mpi")
        pods = {}
        for jname, (_, job) in runtime_jobs(rt_spec).items():
            replicas = job.get("replicas", 1)
            replicas = replicas if is_int(replicas) and replicas > 0 else 1
            if jname == "node":
                count = num_nodes
                if isinstance(mpi, dict) and mpi.get("runLauncherAsNode"):
                    count = max(num_nodes - 1, 1)
            else:
                count = get(job, "template", "spec", "parallelism")
                count = count if is_int(count) and count > 0 else 1
            pods[jname] = (replicas, count)
    longest = ""
    for jname, (replicas, count) in sorted(pods.items()):
        pod = "%s-%s-%d-%d%s" % (name, jname, replicas - 1, count - 1, POD_SUFFIX)
        if len(pod) > len(longest):
            longest = pod
    if len(longest) > MAX_LABEL_LEN:
        room = MAX_LABEL_LEN - (len(longest) - len(name))
        doc.add(["metadata", "name"], "JobSet pod name '%s' would be %d characters (> 63): with "
                "numNodes=%d the TrainJob name may have at most %d characters"
                % (longest, len(longest), num_nodes, room))


# --------------------------------------------------------------------------------------------
# MPIJob
# --------------------------------------------------------------------------------------------

def check_mpijob(doc):
    spec = as_dict(doc.data.get("spec"))
    policy = spec.get("launcherCreationPolicy")
    if policy is not None and policy not in MPI_LAUNCHER_CREATION_POLICIES:
        doc.add(["spec", "launcherCreationPolicy"], "launcherCreationPolicy must be one of %s "
                "(got %r)" % (", ".join(MPI_LAUNCHER_CREATION_POLICIES), policy))
    slots = spec.get("slotsPerWorker")
    if is_int(slots) and slots < 0:
        doc.add(["spec", "slotsPerWorker"], "slotsPerWorker must be >= 0")
    if "sshAuthMountPath" in spec and spec["sshAuthMountPath"] == "":
        doc.add(["spec", "sshAuthMountPath"], "sshAuthMountPath must not be empty")

    run_policy = as_dict(spec.get("runPolicy"))
    clean = run_policy.get("cleanPodPolicy")
    if clean is not None and clean not in MPI_CLEAN_POD_POLICIES:
        doc.add(["spec", "runPolicy", "cleanPodPolicy"], "cleanPodPolicy must be one of %s (got %r)"
                % (", ".join(MPI_CLEAN_POD_POLICIES), clean))
    for field in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if is_int(run_policy.get(field)) and run_policy[field] < 0:
            doc.add(["spec", "runPolicy", field], "%s must be >= 0" % field)
    managed_by = run_policy.get("managedBy")
    if isinstance(managed_by, str) and managed_by not in MPI_MANAGED_BY:
        doc.add(["spec", "runPolicy", "managedBy"], "managedBy must be %s or %s (got '%s')"
                % (MPI_MANAGED_BY + (managed_by,)))

    specs = spec.get("mpiReplicaSpecs")
    if not isinstance(specs, dict):
        return          # reported by the JSON Schema stage
    rpath = ["spec", "mpiReplicaSpecs"]
    for rtype, rspec in specs.items():
        if rtype not in MPI_REPLICA_TYPES:
            doc.add(rpath + [rtype], "mpiReplicaSpecs key must be Launcher or Worker (got %r)" % rtype)
            continue
        if not isinstance(rspec, dict):
            continue
        restart = rspec.get("restartPolicy")
        if restart is not None and restart not in MPI_RESTART_POLICIES:
            doc.add(rpath + [rtype, "restartPolicy"], "restartPolicy must be one of %s (got %r)"
                    % (", ".join(MPI_RESTART_POLICIES), restart))
        if not as_list(get(rspec, "template", "spec", "containers")):
            doc.add(rpath + [rtype, "template", "spec"], "%s must have at least one container"
                    % rtype)
    launcher = specs.get("Launcher")
    if launcher is None:
        doc.add(rpath, "mpiReplicaSpecs.Launcher is required")
    elif isinstance(launcher, dict):
        replicas = launcher.get("replicas", 1)
        if is_int(replicas) and replicas != 1:
            doc.add(rpath + ["Launcher", "replicas"], "Launcher replicas must be 1 (got %d)" % replicas)

    # Derived object names must be DNS-1035 labels: pods <name>-worker-<i>, <name>-launcher.
    name = effective_name(doc)
    if name is None:
        return
    derived = [name + "-launcher"]
    worker = specs.get("Worker")
    if isinstance(worker, dict):
        replicas = worker.get("replicas", 0)     # mpi-operator defaults Worker replicas to 0
        if is_int(replicas) and replicas < 1:
            doc.add(rpath + ["Worker", "replicas"], "Worker replicas must be >= 1 (got %d)" % replicas)
        elif is_int(replicas):
            derived.append("%s-worker-%d" % (name, replicas - 1))
    for obj in derived:
        msg = check_dns1035_label(obj, "derived name")
        if msg:
            doc.add(["metadata", "name"], msg)


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------

def default_schemas_dir():
    """tests/manifest/schemas: the upstream CRDs, runtimes and examples kept in the repository."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")


def load_shipped_runtimes(schemas_dir):
    """Default ClusterTrainingRuntimes shipped in <schemas>/runtimes, by (kind, name)."""
    runtimes = {}
    for path in sorted(glob.glob(os.path.join(schemas_dir, "runtimes", "*.yaml"))):
        with open(path, "r", encoding="utf-8") as fh:
            text = fh.read()
        for doc in load_documents(text, path):
            if isinstance(doc.data, dict) and doc.data.get("kind") in RUNTIME_KINDS:
                runtimes[(doc.data["kind"], doc.name)] = drop_nulls(doc.data)
    return runtimes


class ManifestValidator(object):
    """Validates Documents; reusable (the CRD validators are built once per kind)."""

    def __init__(self, schemas_dir, shipped_runtimes=True):
        self.schemas_dir = schemas_dir
        self.crds = CRDSet(schemas_dir)
        self.shipped = load_shipped_runtimes(schemas_dir) if shipped_runtimes else {}

    def runtime_index(self, docs):
        """Runtimes visible to TrainJobs: the shipped ones, overridden by input documents."""
        runtimes = dict(self.shipped)
        for doc in docs:
            if isinstance(doc.data, dict) and doc.data.get("kind") in RUNTIME_KINDS \
                    and isinstance(doc.name, str):
                runtimes[(doc.data["kind"], doc.name)] = drop_nulls(doc.data)
        return runtimes

    def validate(self, docs):
        """Validate all documents in place (problems appended to each)."""
        runtimes = self.runtime_index(docs)
        for doc in docs:
            self.validate_one(doc, runtimes)
        return docs

    def validate_one(self, doc, runtimes):
        if not isinstance(doc.data, dict):
            doc.add([], "document must be a mapping (got %s)" % type(doc.data).__name__)
            return
        doc.data = drop_nulls(doc.data)
        api_version, kind = doc.data.get("apiVersion"), doc.data.get("kind")
        if (api_version, kind) not in SUPPORTED_KINDS:
            known = ", ".join("%s %s" % (k, a) for a, k in sorted(SUPPORTED_KINDS))
            doc.add([], "unknown kind %r with apiVersion %r (supported: %s)"
                    % (kind, api_version, known))
            return
        if not self.crds.has(api_version, kind):
            raise UsageError("no CRD for %s %s in %s" % (api_version, kind, self.schemas_dir))

        # Stage 1: JSON Schema
        validator = self.crds.validator(api_version, kind)
        errors = sorted(validator.iter_errors(doc.data),
                        key=lambda e: ([str(p) for p in e.absolute_path], e.message))
        for err in errors:
            doc.add(list(err.absolute_path), shorten(err.message))

        # Stage 2: structural rules of the CRD, metadata, kind-specific rules
        StructuralChecker(doc).walk(self.crds.raw[(api_version, kind)], doc.data, [])
        check_all_metadata(doc, doc.data, [])
        if kind == "TrainJob":
            check_top_metadata(doc, "dns1035")
            check_trainjob(doc, runtimes)
        elif kind in RUNTIME_KINDS:
            check_top_metadata(doc, "subdomain")
            check_runtime(doc)
        elif kind == "MPIJob":
            check_top_metadata(doc, "dns1035")
            check_mpijob(doc)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Validate Kubeflow TrainJob/TrainingRuntime/ClusterTrainingRuntime/MPIJob "
                    "manifests offline against the CRDs plus webhook/controller rules.")
    parser.add_argument("--schemas", metavar="DIR",
                        help="directory with the CRD YAML files (default: $KFT_SCHEMAS_DIR or "
                             "tests/manifest/schemas)")
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML file, or - for stdin")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    schemas_dir = args.schemas or os.environ.get("KFT_SCHEMAS_DIR") or default_schemas_dir()

    usage_errors = []
    docs = []
    for path in args.files:
        try:
            text, label = read_input(path)
            loaded = load_documents(text, label)
            if not loaded:
                raise UsageError("%s: no YAML documents" % label)
            docs.extend(loaded)
        except UsageError as exc:
            usage_errors.append(str(exc))
    try:
        ManifestValidator(schemas_dir).validate(docs)
    except UsageError as exc:
        usage_errors.append(str(exc))
        docs = []

    problems = 0
    for doc in docs:
        for line in doc.lines():
            print(line)
            problems += 1
    for msg in usage_errors:
        sys.stderr.write("validate.py: %s\n" % msg)
    if usage_errors:
        return 2
    if problems:
        sys.stderr.write("validate.py: %d problem(s) in %d document(s)\n" % (problems, len(docs)))
        return 1
    print("ok: %d document(s)" % len(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
