# SPDX-License-Identifier: Apache-2.0
"""What Kubernetes' Job controller and JobSet do with a failed pod of kft-manifest's runtime:
kftrun's exit classes (tools/kftrun/exit_codes.hpp), the Job's failure under its podFailurePolicy,
and the JobSet's action under its failurePolicy rules. Used by tests/manifest (every class, no
containers) and tests/containers/failures.py (the statuses real containers ended with)."""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def exit_classes():
    """kftrun's exit classes {name: status}, from tools/kftrun/exit_codes.hpp (a drift fails here)."""
    with open(os.path.join(REPO, "tools", "kftrun", "exit_codes.hpp")) as f:
        text = f.read()
    found = {m.group(1): int(m.group(2)) for m in re.finditer(r"inline constexpr int (\w+) = (\d+);", text)}
    base = found.pop("signalled_base")
    found.update(preempted=base + 15, sigint=base + 2, sighup=base + 1)
    return found


def jobset_action(runtime, reason, message):
    """What JobSet does with a failed child Job: the first rule whose reasons and patterns
    match (an empty list matches anything), else RestartJobSet (jobset's failure_policy)."""
    for rule in runtime["spec"]["template"]["spec"].get("failurePolicy", {}).get("rules", []):
        reasons, patterns = rule.get("onJobFailureReasons") or [], rule.get("onJobFailureMessagePatterns") or []
        if reasons and reason not in reasons:
            continue
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        if "node" not in (rule.get("targetReplicatedJobs") or ["node"]):
            continue
        return rule["action"]
    return "RestartJobSet"


def job_failure(job_spec, exit_code=None, condition=None, pod="default/kft-torch-node-0-1-abcde"):
    """The Job's failure (reason, message) when its pod fails so, as Kubernetes' Job controller
    writes it (pkg/controller/job/pod_failure_policy.go), or None when the Job does not fail."""
    for index, rule in enumerate(job_spec.get("podFailurePolicy", {}).get("rules", [])):
        codes, conds = rule.get("onExitCodes"), rule.get("onPodConditions")
        if codes is not None and exit_code not in (None, 0):
            if codes.get("containerName") not in (None, "node"):
                continue
            inside = exit_code in codes["values"]
            if inside == (codes["operator"] == "In"):
                if rule["action"] == "FailJob":
                    return ("PodFailurePolicy", f"Container node for pod {pod} failed with exit code {exit_code} "
                                                f"matching FailJob rule at index {index}")
                return None if rule["action"] == "Ignore" else ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        if conds is not None and condition is not None:
            if any(c["type"] == condition and c.get("status", "True") == "True" for c in conds):
                if rule["action"] == "FailJob":
                    return ("PodFailurePolicy", f"Pod {pod} has condition {condition} matching FailJob rule at index {index}")
                return None if rule["action"] == "Ignore" else ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    if job_spec.get("backoffLimit", 6) == 0:
        return ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    return None  # the pod is retried
