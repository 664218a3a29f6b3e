"""One settings model: `canopy.toml` (in the documents folder, or `--config`) plus environment.

Precedence, highest first: explicit keyword arguments (tests, CLI flags), environment variables
(`CANOPY_<SECTION>__<FIELD>`, plus the short aliases below), `canopy.toml`, defaults.
Short aliases: CANOPY_LLM_BASE_URL / CANOPY_LLM_MODEL / CANOPY_LLM_API_KEY (falling back to
OPENAI_BASE_URL / OPENAI_API_KEY) and CANOPY_EMBED_BASE_URL / CANOPY_EMBED_MODEL /
CANOPY_EMBED_API_KEY.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from canopy.errors import ConfigError
from canopy.suggest import did_you_mean

__all__ = [
    "AclRule",
    "AclSettings",
    "AuthSettings",
    "ChunkSettings",
    "CommunitySettings",
    "DistributedSettings",
    "EmbedSettings",
    "ExtractSettings",
    "InputSettings",
    "LLMSettings",
    "PromptSettings",
    "PublishSettings",
    "QuerySettings",
    "ReportSettings",
    "Settings",
    "StorageSettings",
    "commented_toml",
    "load_settings",
]

CONFIG_FILENAME = "canopy.toml"
INDEX_DIRNAME = ".canopy"

def _endpoint_url(value: str | None) -> str | None:
    """An endpoint URL as the openai client needs it: with its scheme (a bare host:port would be
    read as a path, `InvalidUrlClientError: /11434/chat/completions`)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if "://" not in value:
        hint = value if value[:1] != "/" else "localhost" + value
        raise ValueError(f"an endpoint URL needs its scheme: write 'http://{hint}' "
                         "(or https://...)")
    scheme = value.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"an endpoint URL is http:// or https://, not {scheme}://")
    return value


class LLMSettings(BaseModel):
    base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint; unset = builtin offline provider"
    )
    model: str = Field("gpt-4o-mini", description="Chat model name sent to the endpoint")

    @field_validator("base_url")
    @classmethod
    def _has_scheme(cls, value: str | None) -> str | None:
        return _endpoint_url(value)
    api_key: SecretStr | None = Field(
        None, description="API key (many local servers accept any value)"
    )
    concurrency: int = Field(
        64, ge=1, le=256,
        description="Most chat requests in flight: the adaptive window's ceiling "
        "(with adaptive = false, the fixed number)")
    initial_concurrency: int = Field(
        8, ge=1, le=256,
        description="Requests in flight at first; the window grows from here while replies keep "
        "their latency and no 429 comes back (capped by concurrency)")
    min_concurrency: int = Field(1, ge=1, le=256, description="The window's floor under 429s")
    adaptive: bool = Field(
        True, description="Adapt requests in flight to the endpoint (AIMD; a Retry-After pauses "
        "every request); false = always `concurrency`")
    latency_tolerance: float = Field(
        2.0, gt=1, le=100,
        description="Growth stops when requests take this many times the best seen (the "
        "endpoint is queueing, not working in parallel)")
    max_retries: int = Field(
        5, ge=0, le=20, description="Retries on 429/5xx/timeouts, with backoff; a 429 naming a "
        "Retry-After, or one while other requests succeed, refills them (4 x at most)"
    )
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout in seconds")
    backoff_s: float = Field(
        1.0, ge=0, description="First retry wait when no Retry-After is sent; doubles"
    )
    json_schema: bool = Field(
        True, description="Use response_format json_schema; false = JSON mode + validation"
    )
    temperature: float = Field(
        0.0, ge=0, le=2, description="Sampling temperature of every chat request (0: the most "
        "repeatable replies; `canopy eval --answers --repeats` needs more for its repeats to vary)")
    price_input_per_mtok: float | None = Field(
        None, ge=0, description="Price per million prompt tokens, for `canopy index "
        "--estimate` (unset: tokens only)")
    price_output_per_mtok: float | None = Field(
        None, ge=0, description="Price per million completion tokens, for the estimate")

    @property
    def enabled(self) -> bool:
        return bool(self.base_url)


class EmbedSettings(BaseModel):
    base_url: str | None = Field(
        None, description="OpenAI-compatible embeddings endpoint; unset = builtin"
    )
    model: str = Field(
        "text-embedding-3-small", description="Embedding model name sent to the endpoint"
    )

    @field_validator("base_url")
    @classmethod
    def _has_scheme(cls, value: str | None) -> str | None:
        return _endpoint_url(value)
    api_key: SecretStr | None = Field(
        None, description="API key of the embeddings endpoint (not taken from [llm])")
    builtin: Literal["hash", "wordllama"] = Field(
        "hash", description="The builtin embedder used when base_url is unset: hash (feature "
        "hashing of words, no dependency) or wordllama (static semantic word vectors, offline; "
        "pip install 'wordllama>=0.4,<0.5')")
    dims: int = Field(384, ge=32, le=4096, description="Dimensions of the builtin hashing embedder")
    batch_size: int = Field(64, ge=1, le=2048, description="Texts per embeddings request")
    concurrency: int = Field(
        16, ge=1, le=256, description="Most embedding requests in flight (adaptive window ceiling)")
    initial_concurrency: int = Field(
        4, ge=1, le=256, description="Embedding requests in flight at first")

    @property
    def enabled(self) -> bool:
        return bool(self.base_url)


class InputSettings(BaseModel):
    extensions: list[str] = Field(
        [".txt", ".md", ".markdown", ".html", ".htm", ".csv", ".jsonl", ".pdf", ".docx"],
        description="File extensions that are indexed",
    )
    max_file_bytes: int = Field(
        20_000_000, ge=1, description="Larger files are skipped with a reason"
    )
    exclude: list[str] = Field(
        ["**/.git/**", "**/node_modules/**", "**/.*"], description="Glob patterns never indexed"
    )
    front_matter: bool = Field(
        True,
        description="Read YAML front matter of Markdown files: its title names the document and "
        "its other fields (source, author, date...) head every text unit for search and context",
    )
    metadata_fields: list[str] = Field(
        [],
        description="Front-matter fields to keep (empty: every scalar or list field that is not "
        "a link)",
    )
    # Loader limits: a file over one is skipped with the limit named in `canopy status`.
    max_unpacked_bytes: int = Field(
        100_000_000, ge=1, description="Largest total size of a DOCX's unpacked parts (zip bombs)")
    max_pages: int = Field(5_000, ge=1, description="PDFs with more pages are skipped")
    max_paragraphs: int = Field(
        500_000,
        ge=1,
        description="DOCX paragraphs, or CSV/JSONL rows, above which a file is skipped",
    )
    max_text_chars: int = Field(
        20_000_000, ge=1, description="Files whose extracted text is longer are skipped")
    load_timeout_s: float = Field(
        300.0, gt=0, description="Seconds a PDF or DOCX may take to read (in a child process)")


class ChunkSettings(BaseModel):
    chunk_tokens: int = Field(1200, ge=50, le=32000, description="Maximum tokens of a text unit")
    overlap_tokens: int = Field(
        100, ge=0, le=2000, description="Tokens of preceding text prefixed to a unit"
    )
    encoding: str = Field("o200k_base", description="tiktoken encoding used for all counts")


class ExtractSettings(BaseModel):
    entity_types: list[str] = Field(
        ["organization", "person", "geo", "event"],
        description="Entity types extraction asks for (Edge et al. 2024 §2.1.2)")
    max_gleanings: int = Field(
        1, ge=0, le=5, description="Extra passes; stops early when a pass adds nothing"
    )
    claims: bool = Field(False, description="Extract claims (covariates)")
    processes: int | None = Field(
        None, ge=1, le=256, description="Worker processes for the builtin provider's CPU "
        "work (extraction, and the hashing embedder's vectors): unset = one per core when a "
        "run extracts at least 500 text units or hashes at least 10,000 texts (a large "
        "build), else in the writer; 1 = always in the writer")
    summary_max_tokens: int = Field(
        300, ge=20, description="Budget of a merged description summary"
    )


class CommunitySettings(BaseModel):
    max_cluster_size: int = Field(
        10, ge=2, description="Hierarchical Leiden splits a community with more members into "
        "sub-communities")
    seed: int = Field(0xDEADBEEF, description="Seed of the clustering (same graph, same "
                      "communities)")
    max_levels: int = Field(4, ge=1, le=10, description="Deepest levels of the hierarchy")
    max_top_level: int = Field(
        0, ge=0, description="Most top-level communities: the largest stand, the others are "
        "grouped under them by the text units (else documents) they share. 0 = the larger of "
        "max_cluster_size and the square root of the number of text units, so the overview "
        "grows slowly with the corpus")
    modularity_drift: float = Field(
        0.05, ge=0, description="Re-cluster from scratch when modularity falls by more"
    )


class ReportSettings(BaseModel):
    max_context_tokens: int = Field(8000, ge=500, description="Context budget for one report")
    max_report_tokens: int = Field(
        1500, ge=100, description="Most tokens a report (or a view of one) may take: the "
        "completion limit of each report call")


class StorageSettings(BaseModel):
    keep_versions_s: float = Field(
        600.0, ge=0,
        description="Seconds old search-table versions are kept after a newer one commits, for "
        "requests still reading them (a request holds its versions from start to end); index "
        "runs rewrite and prune the search tables at most once per this period, so deleted "
        "text leaves them one to two periods (plus five minutes) after the deletion. 0 = at "
        "once, keeping only the latest version: for indexes no server reads while they are "
        "updated")
    tidy: Literal["background", "inline"] = Field(
        "background",
        description="Who tidies the search tables after `canopy index`, `watch` and "
        "`serve --watch` commit an update: `background` (a detached `canopy tidy` after "
        "`canopy index`, the watcher's idle time), so an update costs what the change costs; "
        "`inline`: the update itself, before it returns. A full build always tidies inline")


class PublishSettings(BaseModel):
    """Published generations (the writer: `canopy publish`, and `canopy index` / `watch` when
    `uri` is set) and the replicas that serve them (`canopy serve --http --index-uri`).
    Object-store credentials come from the environment (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), never from this file."""

    uri: str | None = Field(
        None, description="Where every committed generation is published: a local folder or "
        "s3://bucket/prefix (S3-compatible stores too); unset = not published")
    endpoint_url: str | None = Field(
        None, description="S3-compatible endpoint (MinIO, Ceph, moto...); unset = "
        "AWS_ENDPOINT_URL or AWS itself")
    region: str | None = Field(None, description="S3 region; unset = AWS_REGION or us-east-1")
    grace_s: float = Field(
        600.0, ge=0, description="Seconds a superseded generation stays at the URI after a "
        "newer one is published (replicas still switching or answering from it), then the "
        "writer deletes it and every file no kept generation names; replicas drop their "
        "copies by then, so deleted text leaves every published and cached byte this long "
        "after the first generation without it is published")
    poll_s: float = Field(
        2.0, gt=0, description="Replicas: seconds between checks for a newer generation")
    revocation_bound_s: float = Field(
        30.0, gt=0, description="Replicas: a deletion or revocation published at the URI is "
        "honoured within this many seconds; a replica that has not confirmed within it that "
        "it serves the newest generation refuses to answer until it has")
    cache_dir: Path | None = Field(
        None, description="Replicas: local folder for downloaded generations (unset: "
        "canopy-replica-<user> in the system's temporary folder)")


class DistributedSettings(BaseModel):
    """Distributed indexing on a Ray cluster: the writer's option (`canopy index --ray`), never
    the servers'. The planner, the store and every write stay in the writer; what fans out is
    the endpoint requests (chat and embeddings) and, with the builtin provider, its extraction
    and embedding batches (docs/deployment.md)."""

    ray_address: str | None = Field(
        None, description="Ray cluster `canopy index` fans out to: 'auto' (the cluster `ray "
        "start` runs on this machine), 'host:6379' (a cluster's GCS), 'ray://host:10001' (Ray "
        "Client), or 'local' (start one inside the writer); unset = no Ray, all in the writer")
    workers: int | None = Field(
        None, ge=1, le=1024, description="Ray workers: endpoint actors each endpoint's requests "
        "are spread over, and builtin batches in flight; unset = the cluster's CPUs")
    batch_units: int = Field(
        16, ge=1, le=4096, description="Text units per builtin extraction task (a task costs "
        "about a millisecond of Ray overhead; a unit tens of milliseconds of extraction)")
    ship_code: bool = Field(
        True, description="Send the writer's Canopy code (canopy/ and prompts/, under 1 MB) "
        "to a cluster it joins, with the job (Ray's py_modules): nodes need only Canopy's "
        "dependencies; false = nodes import their own install, which must be the same code")


class TimeRule(BaseModel):
    """An explicit time for the documents a glob matches: a fixed `date`, or a `pattern` whose
    named groups `year`, `month` and `day` (month and day optional) read a date from the path."""

    glob: str = Field(description="Paths the rule applies to, as the [acl] rules' globs")
    date: dt.date | None = Field(None, description="The date of every matched document")
    pattern: str | None = Field(
        None, description="Regular expression searched in the path, e.g. "
        "'(?P<year>\\d{4})-(?P<month>\\d{2})-(?P<day>\\d{2})'")

    @model_validator(mode="after")
    def _one_source(self) -> TimeRule:
        if (self.date is None) == (self.pattern is None):
            raise ValueError(f"[[time.rules]] {self.glob!r}: give either date or pattern")
        if self.pattern is not None:
            try:
                groups = re.compile(self.pattern).groupindex
            except re.error as exc:
                raise ValueError(f"[[time.rules]] {self.glob!r}: bad pattern ({exc})") from None
            if "year" not in groups:
                raise ValueError(f"[[time.rules]] {self.glob!r}: the pattern needs a "
                                 "(?P<year>...) group")
        return self


class TimeSettings(BaseModel):
    """When each document is from (canopy.indexer.doc_time): front matter, then these rules,
    then a date the text states near its start, then the file's modification time."""

    front_matter_fields: list[str] = Field(
        ["date", "published", "published_at", "created", "updated", "modified"],
        description="Front-matter fields read as the document's date, the first present wins")
    rules: list[TimeRule] = Field(
        [], description="[[time.rules]] tables, each a glob and either date = 2024-01-31 or "
        "pattern = '(?P<year>\\d{4})-(?P<month>\\d{2})' (read in the path); the first "
        "matching rule wins, after front matter")
    text_chars: int = Field(
        400, ge=0, le=20_000,
        description="A date stated in this many first characters of the text dates the "
        "document (0 = never read dates from the text)")


class QuerySettings(BaseModel):
    seed: int = Field(42, description="Seed of global search's report shuffling into map "
                      "batches (paper §2.2)")
    map_batch_tokens: int = Field(8000, ge=500, description="Report tokens per global map call")
    reduce_tokens: int = Field(
        8000, ge=500, description="Map points, best first, that global search's reduce call reads")
    local_context_tokens: int | None = Field(
        None, ge=500, description="Context of local and basic search (text units, entities, "
        "relationships, claims, reports) and of each DRIFT step, in tokens. None = what "
        "result_token_limit leaves beside the answer and citations (about 3,800 of 8,000 "
        "without an LLM, 4,600 with one), so results are delivered whole; a larger value is "
        "cut to fit the limit, from the least specific items up, and the result says so. "
        "DRIFT steps take 8,000 when None")
    community_level: int | None = Field(
        None, description="Fixed level for global search; None = dynamic"
    )
    rate_batch_tokens: int = Field(
        4000, ge=1, description="Report digests (title, summary, findings' headlines) per "
        "rating call of dynamic global search, in tokens")
    dynamic_max_rated: int = Field(
        2000, ge=1, description="Reports dynamic global search rates per question at most "
        "(beyond it the most query-similar are rated, and the result's coverage says so)")
    dynamic_max_rating_calls: int = Field(
        16, ge=1, description="Rating calls to the endpoint dynamic global search makes per "
        "question at most, each holding up to rate_batch_tokens of report digests: its cost "
        "bound (16 calls: about 70k prompt tokens at the default batch, where an unbounded "
        "search on 100 articles rated for 96k and Microsoft GraphRAG's dynamic search reads "
        "966k). Past it the most query-similar candidates are rated, the coverage counts the "
        "rest, and the reports already found are read. The builtin provider's ratings cost "
        "nothing and are not bounded by it")
    router_llm: bool = Field(
        True, description="With an LLM configured, the `search` tool and `canopy query -m auto` "
        "ask it to classify the question (one short call); false = the offline rules only")
    drift_depth: int = Field(2, ge=1, le=5, description="Rounds of follow-up questions DRIFT "
                             "search answers")
    drift_breadth: int = Field(3, ge=1, le=10, description="Follow-up questions DRIFT search "
                               "answers per round")
    result_token_limit: int = Field(
        8000, ge=2000, description="Cap of one tool result, in tokens: its text and its "
        "structured content together, as an MCP client receives them (agent hosts warn above "
        "~10k); also of a page of canopy://reports. Truncated results say so and name the call "
        "for the rest. At least 2000: one item of each drill_down list, with its notes")
    cache_mb: int = Field(256, ge=16, description=(
        "Memory the server gives its caches, in MB: search-index pages, callers' views, "
        "per-passage text analysis (`serve --workers N` processes share it, N-th each)"))


class PromptSettings(BaseModel):
    """Your own prompt templates (`canopy prompts export DIR` writes the packaged ones to edit).

    Relative to the folder of canopy.toml (the documents folder by default); keep it outside
    the documents folder, or name it with a leading dot, so the templates are not indexed."""

    dir: Path | None = Field(
        None, description="Folder of templates replacing the packaged ones, file by file "
        "(extract.txt, report.txt, ...); checked when a command starts")

    @field_validator("dir", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # `dir = ""` (the commented default of `canopy init`, uncommented) means no folder,
        # not the folder of canopy.toml.
        return None if isinstance(value, str) and not value.strip() else value


class AclRule(BaseModel):
    glob: str
    labels: list[str]


class AclSettings(BaseModel):
    enabled: bool = Field(False, description="True when canopy.toml has an [acl] section")
    default: list[str] = Field([], description="Labels of files that no rule matches; [] = nobody")
    rules: list[AclRule] = Field([], description="First matching rule wins (in file order)")
    principals: dict[str, list[str]] = Field({}, description="principal -> labels it may read")


class AuthSettings(BaseModel):
    """Who an HTTP caller is (`canopy serve --http`): a static token file, JWTs, or both.

    Relative paths are relative to the folder of canopy.toml (the documents folder by default).
    Keep the token file outside the documents folder (or name it with a leading dot) so it is
    never indexed. Over stdio the caller is `--principal` / CANOPY_PRINCIPAL instead.
    """

    tokens_file: Path | None = Field(
        None,
        description="JSON-lines file of hashed bearer tokens -> principal (`canopy token add`)",
    )
    principal_claim: str = Field(
        "sub", min_length=1, description="JWT claim naming the caller's principal"
    )
    jwt_issuer: str | None = Field(
        None, description="Required `iss` of JWTs; setting it turns JWT checks on"
    )
    jwt_audience: str | None = Field(
        None, description="Required `aud` of JWTs (this server's identifier)"
    )
    jwt_jwks_url: str | None = Field(
        None, description="JWKS endpoint of the identity provider (keys cached)"
    )
    jwt_key: SecretStr | None = Field(None, description="Shared secret for HS256/384/512 JWTs")
    jwt_public_key_file: Path | None = Field(
        None, description="PEM public key for RS/PS/ES/EdDSA JWTs"
    )
    jwt_algorithms: list[str] = Field(
        [], description="Accepted JWT algorithms; [] = HS256 with jwt_key, else RS256 and ES256")
    jwt_leeway_s: float = Field(30.0, ge=0, le=600, description="Clock skew allowed on exp/nbf/iat")
    resource_url: str | None = Field(
        None, description="Public URL of this server's /mcp endpoint, advertised to OAuth clients")

    @property
    def jwt_enabled(self) -> bool:
        return bool(self.jwt_issuer or self.jwt_audience or self.jwt_jwks_url or self.jwt_key
                    or self.jwt_public_key_file)

    @property
    def enabled(self) -> bool:
        return self.tokens_file is not None or self.jwt_enabled


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CANOPY_", env_nested_delimiter="__", extra="ignore", toml_file=None
    )

    llm: LLMSettings = LLMSettings()
    embed: EmbedSettings = EmbedSettings()
    input: InputSettings = InputSettings()
    chunking: ChunkSettings = ChunkSettings()
    extract: ExtractSettings = ExtractSettings()
    communities: CommunitySettings = CommunitySettings()
    reports: ReportSettings = ReportSettings()
    storage: StorageSettings = StorageSettings()
    query: QuerySettings = QuerySettings()
    prompts: PromptSettings = PromptSettings()
    acl: AclSettings = AclSettings()
    auth: AuthSettings = AuthSettings()
    publish: PublishSettings = PublishSettings()
    distributed: DistributedSettings = DistributedSettings()
    time: TimeSettings = TimeSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = settings_cls.model_config.get("toml_file")
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            _AliasEnvSource(settings_cls),
            env_settings,
        ]
        if toml_path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_path))
        return tuple(sources)


class _AliasEnvSource(PydanticBaseSettingsSource):
    """The short, documented variable names (and OpenAI's own) for the endpoint settings."""

    _ALIASES = {
        ("llm", "base_url"): ("CANOPY_LLM_BASE_URL", "OPENAI_BASE_URL"),
        ("llm", "model"): ("CANOPY_LLM_MODEL",),
        ("llm", "api_key"): ("CANOPY_LLM_API_KEY", "OPENAI_API_KEY"),
        ("embed", "base_url"): ("CANOPY_EMBED_BASE_URL",),
        ("embed", "model"): ("CANOPY_EMBED_MODEL",),
        ("embed", "api_key"): ("CANOPY_EMBED_API_KEY",),
    }

    def get_field_value(
        self, field: Any, field_name: str
    ) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, dict[str, str]] = {}
        for (section, key), names in self._ALIASES.items():
            for name in names:
                value = os.environ.get(name)
                if value:
                    out.setdefault(section, {})[key] = value
                    break
        return out


def find_config(docs_dir: Path | None, config: Path | None = None) -> Path | None:
    if config is not None:
        return config
    if docs_dir is not None and (docs_dir / CONFIG_FILENAME).is_file():
        return docs_dir / CONFIG_FILENAME
    return None


def load_settings(
    docs_dir: Path | None = None, config: Path | None = None, **overrides: Any
) -> Settings:
    """Settings for a documents folder: its canopy.toml (or `config`), then env, then overrides.

    A file that is not TOML, a key no section has (`[chunkin]`, `modle =`), a `CANOPY_X__Y`
    variable naming no setting, or a value of the wrong kind raises ConfigError: one line naming
    the file or variable, the key, and what is allowed."""
    path = find_config(docs_dir, config)
    table: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as fh:
                table = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
        unknown = _unknown_keys(table, Settings)
        if unknown:
            raise ConfigError(f"{path}: {unknown}")
    for name in sorted(os.environ):
        if name.startswith("CANOPY_") and "__" in name:
            keys = name.removeprefix("CANOPY_").lower().split("__")
            unknown = _unknown_keys(_nest(keys), Settings)
            if unknown:
                raise ConfigError(f"environment variable {name}: {unknown}")
    # pydantic-settings takes the TOML file from the class's config: a subclass per file
    # (no shared state, so serving and watching threads may load settings at once).
    cls = Settings if path is None else type("Settings", (Settings,), {
        "model_config": SettingsConfigDict(**{**Settings.model_config, "toml_file": path})})
    try:
        settings = cls(**overrides)
    except ValidationError as exc:
        raise ConfigError(_invalid(exc, path, table)) from None
    if "acl" in table and not settings.acl.enabled:
        settings.acl.enabled = True
    _check_prompts(settings, path, docs_dir)
    return settings


def _check_prompts(settings: Settings, path: Path | None, docs_dir: Path | None) -> None:
    """Resolve `[prompts] dir` (relative to canopy.toml's folder, else the documents folder)
    and check its templates now, so that a bad one stops any command before it starts."""
    from canopy.prompt_dir import load_prompt_dir, warn_if_indexed

    folder = settings.prompts.dir
    if folder is None:
        return
    if not folder.is_absolute():
        base = path.parent if path is not None else docs_dir if docs_dir is not None else Path()
        folder = settings.prompts.dir = (base / folder).resolve()
    load_prompt_dir(folder)
    warn_if_indexed(folder, docs_dir)


def _nest(keys: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = None
    return out


def _unknown_keys(table: dict[str, Any], model: type[BaseModel], where: str = "") -> str | None:
    """The first key of `table` that `model` has no field for, as a message with a
    did-you-mean; sections are checked down to their own models' fields."""
    fields = model.model_fields
    for key, value in table.items():
        name = f"{where}.{key}" if where else key
        if key not in fields:
            label = f"[{name}]" if isinstance(value, dict) and not where else f"{name!r}"
            known = ", ".join(sorted(fields))
            return f"unknown key {label}{did_you_mean(key, fields)} (known here: {known})"
        sub = _model_of(fields[key].annotation)
        items = [(name, value)] if isinstance(value, dict) else [
            (f"{name}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else []
        for item_name, item in items:
            if sub is not None and isinstance(item, dict):
                found = _unknown_keys(item, sub, item_name)
                if found:
                    return found
    return None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds (also inside Optional), else None."""
    candidates = [annotation, *get_args(annotation)]
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def _invalid(exc: ValidationError, path: Path | None, table: dict[str, Any]) -> str:
    """A validation error as one line: where the value came from, the key, what is allowed."""
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc)
        env = "CANOPY_" + "__".join(loc).upper()
        aliases = [name for name in _AliasEnvSource._ALIASES.get((loc[0], loc[-1]), ())
                   if os.environ.get(name)] if len(loc) == 2 else []
        if aliases and env not in os.environ:
            env = aliases[0]  # the short name wins over the file (precedence above)
        if path is not None and loc and loc[0] in table and env not in os.environ:
            source = f"{path}: {key}"
        elif env in os.environ:
            source = f"environment variable {env}"
        else:
            source = key
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(
            err["input"], dict) else ""
        parts.append(f"{source}: {err['msg'].removeprefix('Value error, ')}{got}")
    return "; ".join(parts)


def commented_toml() -> str:
    """A canopy.toml with every section and setting, its description and its default, all
    commented out (`canopy init`): the file changes nothing until a line is uncommented. [acl]
    stays commented as a whole, since the section's presence turns the policy on."""
    out = ["# Canopy settings (canopy.toml). Every setting is shown with its default, commented",
           "# out: uncomment a [section] line and the settings under it to change them. The",
           "# environment overrides this file: CANOPY_<SECTION>__<FIELD>, for example",
           "# CANOPY_CHUNKING__CHUNK_TOKENS=600. A key that does not exist is an error."]
    for section, field in Settings.model_fields.items():
        model = _model_of(field.annotation)
        assert model is not None
        out += ["", f"# [{section}]"]
        if model.__doc__ and model.__doc__.strip() and section in ("auth", "prompts"):
            out += [f"#   {line.strip()}" for line in model.__doc__.strip().splitlines()
                    if line.strip()]
        if section == "acl":
            out += ["#   Present, this section turns the access policy on: a caller reads a",
                    "#   document only with one of its labels (deny by default).",
                    "# default = []            # labels of files no rule matches; [] = nobody",
                    "# [[acl.rules]]           # the first matching glob decides, in file order",
                    '# glob = "finance/**"',
                    '# labels = ["finance"]',
                    "# [acl.principals]        # who holds which labels",
                    '# alice = ["finance"]']
            continue
        for name, f in model.model_fields.items():
            value = f.default
            shown = _toml_value(value) if value is not None else '""'
            unset = " (unset by default)" if value is None else ""
            note = f"  # {f.description}{unset}" if f.description else (
                f"  #{unset}" if unset else "")
            out.append(f"# {name} = {shown}{note}")
    return "\n".join(out) + "\n"


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, SecretStr):
        return '""'
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, dict):
        return "{}" if not value else "{ " + ", ".join(
            f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value, ensure_ascii=False)  # strings and lists of them: TOML-compatible

