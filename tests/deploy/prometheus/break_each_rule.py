#!/usr/bin/env python3
"""Shows that the `promtool test rules` unit tests pin every rule: each rule of RULES is broken
in turn (an alert made never to fire, then always to fire; a recording rule made to record 0),
and the tests of TEST that name that rule, run against the broken copy, must fail. All broken
copies go to one promtool run. Prints one line per broken rule; exits 1 when a broken rule
passes its tests (those tests prove nothing), 2 when the unbroken rules fail theirs.

usage: break_each_rule.py RULES TEST [PROMTOOL]
"""
import copy
import os
import re
import subprocess
import sys
import tempfile

import yaml

MUTATIONS_ALERT = [("never fires", "vector(1) == 0"), ("always fires", "vector(1)")]
MUTATIONS_RECORD = [("records 0", "vector(0)")]


def tests_naming(test_doc, name):
    """The test groups whose alert or expression checks name `name`."""
    out = []
    for group in test_doc["tests"]:
        alerts = [t.get("alertname") for t in group.get("alert_rule_test", [])]
        exprs = [t.get("expr", "") for t in group.get("promql_expr_test", [])]
        if name in alerts or any(re.search(r"\b" + re.escape(name) + r"\b", e) for e in exprs):
            out.append(group)
    return out


def write_case(tmp, index, rules_doc, test_doc, groups):
    case = os.path.join(tmp, f"case{index:03d}")
    os.makedirs(case)
    with open(os.path.join(case, "rules.yml"), "w") as f:
        yaml.safe_dump(rules_doc, f)
    doc = {k: v for k, v in test_doc.items() if k != "tests"}
    doc["rule_files"] = ["rules.yml"]
    doc["tests"] = groups
    path = os.path.join(case, "test.yml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    return path


def results(promtool, paths):
    """{test file: passed} from one `promtool test rules` run over them all."""
    done = subprocess.run([promtool, "test", "rules", *paths], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    passed, current = {}, None
    for line in done.stdout.splitlines():
        m = re.match(r"\s*Unit Testing:\s+(\S+)", line)
        if m:
            current = m.group(1)
            passed[current] = True
        elif current and ("FAILED" in line or line.strip().startswith("error")):
            passed[current] = False
    return passed, done.stdout


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    rules_path, test_path = sys.argv[1], sys.argv[2]
    promtool = sys.argv[3] if len(sys.argv) == 4 else "promtool"
    with open(rules_path) as f:
        rules = yaml.safe_load(f)
    with open(test_path) as f:
        test_doc = yaml.safe_load(f)
    with tempfile.TemporaryDirectory(prefix="baton-rules-") as tmp:
        cases = [("unbroken", "", write_case(tmp, 0, rules, test_doc, test_doc["tests"]))]
        for g, group in enumerate(rules["groups"]):
            for r, rule in enumerate(group["rules"]):
                label = rule.get("alert") or rule.get("record")
                groups = tests_naming(test_doc, label)
                if not groups:
                    print(f"{label}: NO TEST names it")
                    return 1
                for what, expr in MUTATIONS_ALERT if "alert" in rule else MUTATIONS_RECORD:
                    broken = copy.deepcopy(rules)
                    broken["groups"][g]["rules"][r]["expr"] = expr
                    path = write_case(tmp, len(cases), broken, test_doc, groups)
                    cases.append((label, f"{what} ({expr})", path))
        passed, output = results(promtool, [path for _, _, path in cases])
        if not passed.get(cases[0][2], False):
            print(output)
            print("the unbroken rules fail their tests")
            return 2
        survivors = []
        for label, what, path in cases[1:]:
            if path not in passed:
                print(output)
                print(f"promtool said nothing of {path}")
                return 2
            caught = not passed[path]
            print(f"{label}: {what} -> {'the tests fail: caught' if caught else 'THE TESTS PASS'}")
            if not caught:
                survivors.append(f"{label} {what}")
    print(f"{len(cases) - 1} broken rules, {len(cases) - 1 - len(survivors)} caught")
    if survivors:
        print("not caught: " + ", ".join(survivors))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
