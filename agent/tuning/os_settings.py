"""The OS-level actuators: cpufreq governor (every CPU), allowlisted sysctls, transparent hugepages
(enabled, defrag) and the hugepages count. Each maps its settings to one kernel file apiece; the
shared read/plan/apply/verify lives in `FileActuator`, each subclass says which files, how to
parse them and which values they take. The agent's existing parsers read the files."""

from __future__ import annotations

from agent.sources.linux.proc import parse_bracketed
from agent.sources.linux.sysfs import natural_key, parse_word
from agent.tuning.base import Actuator, Change, Shortfall, Tree, TuningError
from agent.tuning.targets import SYSCTLS, OsTargets, Targets, as_targets

CPUFREQ_GLOB = "sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"
THP_DIR = "sys/kernel/mm/transparent_hugepage"
NR_HUGEPAGES = "proc/sys/vm/nr_hugepages"


def parse_int(text: str) -> str:
    value = text.strip()
    if not value.lstrip("-").isdigit():
        raise ValueError(f"{value[:20]!r} is not a number")
    return str(int(value))


def choices(text: str) -> list[str]:
    """The values a choice file takes: "always [madvise] never" -> always, madvise, never."""
    return [word.strip("[]") for word in text.split()]


class FileActuator:
    """Settings that are one kernel file each; subclasses give `files`, `wanted`, `parse`, `allowed`."""

    name = "file"

    def files(self, tree: Tree) -> dict[str, str]:
        """setting -> file (relative to the root) for the settings present on this host."""
        raise NotImplementedError

    def wanted(self, tree: Tree, targets: OsTargets) -> dict[str, str]:
        """setting -> target value asked by `targets` (raises when a setting is not supported)."""
        raise NotImplementedError

    def parse(self, text: str) -> str:
        return parse_word(text)

    def allowed(self, tree: Tree, setting: str) -> list[str] | None:
        """The values the kernel takes for `setting`, when it says (None: any value parse accepts)."""
        return None

    def file(self, tree: Tree, setting: str) -> str:
        rel = self.files(tree).get(setting)
        if rel is None:
            raise TuningError(f"not supported on this kernel: no file for {setting}")
        return rel

    def current(self, tree: Tree, setting: str) -> str:
        rel = self.file(tree, setting)
        text = tree.read(rel)
        try:
            return self.parse(text)
        except ValueError as exc:
            raise TuningError(f"/{rel}: {exc}") from None

    def read(self, tree: Tree) -> dict[str, str]:
        return {setting: self.current(tree, setting) for setting in self.files(tree)}

    def plan(self, tree: Tree, targets: Targets | OsTargets) -> list[Change]:
        changes = []
        for setting, target in self.wanted(tree, as_targets(targets).os).items():
            current = self.current(tree, setting)
            if current != target:
                changes.append(Change(setting, current, target))
        return changes

    def validate(self, tree: Tree, change: Change) -> None:
        allowed = self.allowed(tree, change.setting)
        if allowed is not None and change.target not in allowed:
            raise TuningError(f"{change.setting}: {change.target!r} is not one of {', '.join(allowed)}")
        tree.check_writable(self.file(tree, change.setting))

    def apply(self, tree: Tree, change: Change) -> None:
        tree.write(self.file(tree, change.setting), change.target)

    def verify(self, tree: Tree, change: Change) -> None:
        now = self.current(tree, change.setting)
        if now != change.target:
            raise TuningError(f"{change.setting}: read back {now!r} after writing {change.target!r}")


class CpuGovernor(FileActuator):
    """scaling_governor of every CPU with cpufreq, checked against its scaling_available_governors."""

    name = "cpu_governor"

    def files(self, tree: Tree) -> dict[str, str]:
        rels = sorted(tree.glob(CPUFREQ_GLOB), key=lambda rel: natural_key(rel.split("/")[4]))
        return {f"os.cpu_governor.{rel.split('/')[4]}": rel for rel in rels}

    def wanted(self, tree: Tree, targets: OsTargets) -> dict[str, str]:
        if targets.cpu_governor is None:
            return {}
        settings = self.files(tree)
        if not settings:
            raise TuningError(f"not supported on this kernel: no cpufreq (/{CPUFREQ_GLOB})")
        return dict.fromkeys(settings, targets.cpu_governor)

    def allowed(self, tree: Tree, setting: str) -> list[str] | None:
        available = self.file(tree, setting).replace("scaling_governor", "scaling_available_governors")
        return tree.read(available).split() if tree.exists(available) else None


class Sysctls(FileActuator):
    """The allowlisted sysctls (targets.SYSCTLS), dotted name -> proc/sys path; others refused."""

    name = "sysctls"

    @staticmethod
    def setting(name: str) -> str:
        return f"os.sysctls.{name}"

    @staticmethod
    def path(name: str) -> str:
        return "proc/sys/" + name.replace(".", "/")

    def files(self, tree: Tree) -> dict[str, str]:
        return {self.setting(name): self.path(name) for name in SYSCTLS if tree.exists(self.path(name))}

    def file(self, tree: Tree, setting: str) -> str:
        return self.path(setting.removeprefix("os.sysctls."))  # a missing one: "not supported" on read

    def wanted(self, tree: Tree, targets: OsTargets) -> dict[str, str]:
        for name in targets.sysctls:
            if name not in SYSCTLS:
                raise TuningError(f"sysctl {name!r} is not in the allowlist ({', '.join(SYSCTLS)})")
        return {self.setting(name): str(value) for name, value in targets.sysctls.items()}

    def parse(self, text: str) -> str:
        return parse_int(text)

    def validate(self, tree: Tree, change: Change) -> None:
        low, high = SYSCTLS[change.setting.removeprefix("os.sysctls.")]
        if not low <= int(change.target) <= high:
            raise TuningError(f"{change.setting}: {change.target} is outside {low}..{high}")
        super().validate(tree, change)


class TransparentHugepages(FileActuator):
    """sys/kernel/mm/transparent_hugepage/{enabled,defrag}: the [bracketed] word is the current one."""

    name = "transparent_hugepages"

    def files(self, tree: Tree) -> dict[str, str]:
        rels = {f"os.transparent_hugepages.{key}": f"{THP_DIR}/{key}" for key in ("enabled", "defrag")}
        return {setting: rel for setting, rel in rels.items() if tree.exists(rel)}

    def wanted(self, tree: Tree, targets: OsTargets) -> dict[str, str]:
        asked = {"enabled": targets.thp_enabled, "defrag": targets.thp_defrag}
        return {f"os.transparent_hugepages.{k}": v for k, v in asked.items() if v is not None}

    def parse(self, text: str) -> str:
        return parse_bracketed(text)

    def allowed(self, tree: Tree, setting: str) -> list[str] | None:
        return choices(tree.read(self.file(tree, setting)))


class Hugepages(FileActuator):
    """vm.nr_hugepages: the kernel may allocate fewer than asked (fragmented memory): a Shortfall."""

    name = "hugepages"
    setting = "os.hugepages"

    def files(self, tree: Tree) -> dict[str, str]:
        return {self.setting: NR_HUGEPAGES} if tree.exists(NR_HUGEPAGES) else {}

    def wanted(self, tree: Tree, targets: OsTargets) -> dict[str, str]:
        return {} if targets.hugepages is None else {self.setting: str(targets.hugepages)}

    def parse(self, text: str) -> str:
        return parse_int(text)

    def validate(self, tree: Tree, change: Change) -> None:
        if int(change.target) < 0:
            raise TuningError(f"{change.setting}: {change.target} is not a count (0 or more)")
        super().validate(tree, change)

    def verify(self, tree: Tree, change: Change) -> None:
        now = int(self.current(tree, change.setting))
        if now < int(change.target):
            raise Shortfall(
                f"{change.setting}: partial apply, the kernel allocated {now} of {change.target} "
                "huge pages (memory fragmented)"
            )
        super().verify(tree, change)


def os_actuators() -> list[Actuator]:
    """Every OS-level actuator, in the order an apply visits them."""
    return [CpuGovernor(), Sysctls(), TransparentHugepages(), Hugepages()]
