"""Resolve artifacts from Maven Central with the machine's `mvn` into its local cache (~/.m2)."""

from __future__ import annotations

from pathlib import Path

from infra.procs import InfraError, run

M2_REPO = Path.home() / ".m2" / "repository"


def artifact_path(coords: str, packaging: str = "jar") -> Path:
    """Where `group:artifact:version` lands in the local Maven repository."""
    group, artifact, version = coords.split(":")
    return M2_REPO / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.{packaging}"


def fetch_artifact(coords: str, part: str, log: Path, packaging: str = "jar") -> Path:
    """Download one artifact (no dependencies) unless it is cached; return its path."""
    path = artifact_path(coords, packaging)
    if path.exists():
        return path
    run(
        ["mvn", "-B", "-q", "-U", "dependency:get", f"-Dartifact={coords}:{packaging}", "-Dtransitive=false"],
        part,
        log,
    )
    if not path.exists():
        raise InfraError(part, f"maven reported success but {path} is missing", log)
    return path


def copy_dependencies(pom: str, workdir: Path, out_dir: Path, part: str, log: Path) -> list[Path]:
    """Resolve a generated pom's runtime dependencies into out_dir; return the jars."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "pom.xml").write_text(pom)
    run(
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            str(workdir / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out_dir}",
            "-DincludeScope=runtime",
        ],
        part,
        log,
    )
    jars = sorted(out_dir.glob("*.jar"))
    if not jars:
        raise InfraError(part, f"no jars resolved into {out_dir}", log)
    return jars
