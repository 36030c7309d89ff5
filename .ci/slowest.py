"""The 20 slowest tests of the JUnit XML reports given (both tiers of .ci/run): a creeping test shows in every
CI log. A test's time is its setup, call and teardown together, as pytest's junitxml writes it."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def main(paths: list[str], top: int = 20) -> None:
    cases = []
    for path in paths:
        tier = path.rsplit("/", 1)[-1].removesuffix(".xml")
        for case in ET.parse(path).iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time", 0.0)), tier, name))
    cases.sort(reverse=True)
    print(f"== the {top} slowest tests of both tiers (of {len(cases)})")
    for seconds, tier, name in cases[:top]:
        print(f"{seconds:8.1f} s  {tier:5}  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
