"""Source specs: where a source's raw files are, what they are, and under which licence.

Bundled specs live in `manifests/sources/<name>.toml` and resolve their `path`
against the `manifests/` directory; a user's spec file resolves against its
own directory. The corpus manifest copies origin, snapshot and licence from here.
"""
from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLED_SPECS = PACKAGE_DIR / "sources"
SOURCE_KINDS = ("html_dir", "warc", "jsonl", "parquet", "text_dir", "hf_disk")
PROFILES = ("web", "prose", "documentation", "code")  # web: FineWeb's published chain, for a source that names none
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class SourceSpecError(ValueError):
    """A source spec is missing a field, names an unknown kind, or points nowhere."""


@dataclass(frozen=True)
class SourceSpec:
    name: str
    kind: str
    path: str
    origin: str
    snapshot: str
    license: str
    profile: str = "web"
    langs: tuple[str, ...] = ()  # languages kept from this source besides [langid] langs; none declared: only those
    glob: str = "**/*"
    url_prefix: str = ""
    text_field: str = "text"
    url_field: str = "url"
    id_field: str = "id"  # the record's own id, kept in meta.record_id (HyMo's id is unique across files and snapshots)
    description: str = ""
    base_dir: str = field(default=str(PACKAGE_DIR), compare=False)

    @property
    def root(self) -> Path:
        path = Path(self.path)
        return path if path.is_absolute() else Path(self.base_dir) / path

    def public(self) -> dict[str, object]:
        """The spec as recorded in manifests (no machine-local base directory)."""
        return {
            "name": self.name, "kind": self.kind, "path": self.path, "origin": self.origin,
            "snapshot": self.snapshot, "license": self.license, "profile": self.profile,
            "langs": list(self.langs), "glob": self.glob, "url_prefix": self.url_prefix,
            "text_field": self.text_field, "url_field": self.url_field, "id_field": self.id_field,
        }


def parse_spec(raw: dict, base_dir: Path, where: str) -> SourceSpec:
    missing = [k for k in ("name", "kind", "path", "origin", "snapshot", "license") if not raw.get(k)]
    if missing:
        raise SourceSpecError(f"{where}: missing {', '.join(missing)}")
    if not NAME_RE.match(raw["name"]):
        raise SourceSpecError(f"{where}: source name {raw['name']!r} must match {NAME_RE.pattern}")
    if raw["kind"] not in SOURCE_KINDS:
        raise SourceSpecError(f"{where}: kind {raw['kind']!r} is not one of {', '.join(SOURCE_KINDS)}")
    if raw.get("profile", "web") not in PROFILES:
        raise SourceSpecError(f"{where}: profile {raw.get('profile')!r} is not one of {', '.join(PROFILES)}")
    known = set(SourceSpec.__dataclass_fields__) - {"base_dir"}
    unknown = set(raw) - known
    if unknown:
        hints = [f"{key!r} -> {near[0]!r}" for key in sorted(unknown) if (near := difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6))]
        raise SourceSpecError(f"{where}: unknown keys {sorted(unknown)}" + (f"; did you mean {', '.join(hints)}?" if hints else "")
                              + f" (known: {', '.join(sorted(known))})")
    values = dict(raw)
    values["langs"] = tuple(values.get("langs", ()))
    return SourceSpec(**values, base_dir=str(base_dir))


def load_spec_file(path: Path, base_dir: Path | None = None) -> SourceSpec:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SourceSpecError(f"{path}: cannot read source spec ({exc})") from exc
    return parse_spec(raw, base_dir or path.parent, str(path))


def spec_path(name_or_path: str, config_dir: Path | None = None) -> Path:
    """The spec file a pipeline config's `sources` entry names: a path (relative to the config's directory), or a
    bundled source's name."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml":
        if not candidate.is_absolute() and config_dir is not None:
            candidate = config_dir / candidate
        return candidate.absolute()
    return BUNDLED_SPECS / f"{name_or_path}.toml"


def load_source(name_or_path: str, config_dir: Path | None = None) -> SourceSpec:
    """A bundled source by name, or a spec file by path (relative to the config's directory)."""
    path = spec_path(name_or_path, config_dir)
    if Path(name_or_path).suffix == ".toml":
        return load_spec_file(path)  # its relative paths resolve against its directory, on any worker
    bundled = path
    if not bundled.is_file():
        available = sorted(p.stem for p in BUNDLED_SPECS.glob("*.toml"))
        raise SourceSpecError(f"unknown source {name_or_path!r}; bundled sources: {', '.join(available) or 'none'}")
    return load_spec_file(bundled, base_dir=PACKAGE_DIR)
