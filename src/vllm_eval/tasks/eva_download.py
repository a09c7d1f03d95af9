"""``generate --download``: eva's task files fetched into eva's layouts under a data root, as eva's ``download: true``
does, only when asked and only what the task reads.

* PatchCamelyon: the val and test HDF5 files from zenodo record 2546921, by the URLs and MD5 sums of eva's
  ``PatchCamelyon._val_resources`` and ``_test_resources`` (read from eva's installed source); each ``.gz`` is
  unpacked and the file's MD5 checked as eva checks it. eva also fetches the train split (about 7 GB), which no
  task reads; it is left out.
* PathMMU Atlas: the ARCH book set zip (eva's ``_arch_book_set_url`` and MD5), unpacked under ``arch/``, and
  ``data.json`` by eva's own ``_download_path_mmu_hf`` (``huggingface_hub``).
* PubMedQA: eva's own ``PubMedQA(download=True).prepare_data()``, which saves each split with ``save_to_disk``.
* Quilt-VQA: eva's own ``QuiltVQA._load_dataset`` with ``download`` on (a gated hub dataset: log in first).

A file already there with the right MD5 is kept. Offline (``HF_HUB_OFFLINE``, or a host that does not answer within
:data:`CONNECT_TIMEOUT_S`), the call stops in one line naming what it could not reach; nothing is left half written
under a final name.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..utils.errors import DataUnavailableError
from ..utils.eva_source import class_attribute, class_function, local_litellm_cost_map
from .eva_data import PATH_MMU, PCAM_VISION, QUILT

#: Seconds to connect to a download host (a machine offline fails in this time, not after a hang).
CONNECT_TIMEOUT_S = 10.0
#: Seconds a download may wait for the next bytes.
READ_TIMEOUT_S = 60.0


def download_task(task: Any, root: str | Path, *, client: Any = None, show_progress: bool = True) -> Path:
    """Fetch ``task``'s files (an :class:`~vllm_eval.tasks.eva.EvaTask`) into ``root``, its folder (created).

    Args:
        client: an ``httpx.Client`` for the zenodo and ARCH files (default: one with this module's timeouts).

    Returns:
        ``root``.

    Raises:
        DataUnavailableError: offline, a host that does not answer or refuses, a file whose MD5 is not eva's, or the
            hub's refusal (a gated dataset): one line naming the URL or dataset.
    """
    import httpx

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    own = client is None
    client = client or httpx.Client(
        timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), follow_redirects=True
    )
    try:
        fetchers = {
            "eva.PatchCamelyon": _patch_camelyon,
            "eva.PathMMUAtlas": _path_mmu_atlas,
            "eva.PubMedQA": _pubmedqa,
            "eva.QuiltVQA": _quilt_vqa,
        }
        fetchers[task.name](task, root, client, show_progress)
    finally:
        if own:
            client.close()
    return root


def pcam_resources(splits: tuple[str, ...]) -> list[Any]:
    """eva's PatchCamelyon download resources (``filename``, ``url``, ``md5``) of ``splits`` (``val``, ``test``)."""
    shim = {"structs": SimpleNamespace(DownloadResource=lambda **kw: SimpleNamespace(**kw))}
    out = []
    for split in splits:
        for r in class_attribute(PCAM_VISION, "PatchCamelyon", f"_{split}_resources", shim):
            out.append(SimpleNamespace(filename=r.filename, url=r.url, md5=r.md5))
    return out


def _patch_camelyon(task: Any, root: Path, client: Any, show_progress: bool) -> None:
    for r in pcam_resources(task.splits):
        target = root / r.filename
        if target.is_file() and md5_of(target) == r.md5:
            continue
        packed = root / (r.filename + ".gz")
        fetch(client, r.url, packed, show_progress=show_progress)
        part = target.with_name(target.name + ".part")
        try:  # the .gz goes either way: a bad one is fetched again next time
            with gzip.open(packed, "rb") as src, part.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (OSError, EOFError) as exc:
            part.unlink(missing_ok=True)
            raise DataUnavailableError(f"PatchCamelyon: {r.url} did not unpack ({exc})") from None
        finally:
            packed.unlink(missing_ok=True)
        _checked(part, r.md5, r.url)
        part.replace(target)


def _path_mmu_atlas(task: Any, root: Path, client: Any, show_progress: bool) -> None:
    url = class_attribute(PATH_MMU, "PathMMUAtlas", "_arch_book_set_url")
    md5 = class_attribute(PATH_MMU, "PathMMUAtlas", "_arch_book_set_md5")
    expected = class_attribute(PATH_MMU, "PathMMUAtlas", "_expected_arch_images")
    arch = root / "arch"
    images = arch / "books_set" / "images"
    if not images.is_dir() or sum(1 for f in images.iterdir() if f.suffix == ".png") != expected:
        packed = arch / "books_set.zip"
        arch.mkdir(parents=True, exist_ok=True)
        fetch(client, url, packed, md5=md5, show_progress=show_progress)
        try:
            with zipfile.ZipFile(packed) as archive:
                archive.extractall(arch)
        except (OSError, zipfile.BadZipFile) as exc:
            raise DataUnavailableError(f"PathMMUAtlas: {url} did not unpack ({exc})") from None
        packed.unlink()
    own = class_function(PATH_MMU, "PathMMUAtlas", "_download_path_mmu_hf")
    this = SimpleNamespace(_path_mmu_hf_path=str(root / "path_mmu_hf"))
    _from_hub("PathMMUAtlas", "jamessyx/PathMMU", lambda: own(this))


def _pubmedqa(task: Any, root: Path, client: Any, show_progress: bool) -> None:
    local_litellm_cost_map()
    from eva.language.data.datasets import PubMedQA

    for split in task.splits:
        if not (root / split / "dataset_info.json").is_file():
            dataset = PubMedQA(root=str(root), split=split, download=True)
            _from_hub("PubMedQA", "bigbio/pubmed_qa", dataset.prepare_data)


def _quilt_vqa(task: Any, root: Path, client: Any, show_progress: bool) -> None:
    folder = root / "test"
    if (folder / "dataset_info.json").is_file():
        return
    load = class_function(QUILT, "QuiltVQA", "_load_dataset")
    _from_hub("QuiltVQA", "wisdomik/Quilt_VQA", lambda: load(SimpleNamespace(_download=True), str(folder)))


def _from_hub(task: str, repo: str, call: Any) -> None:
    """``call()``, eva's own hub download; offline, or refused by the hub, one line naming the dataset."""
    from ..utils.hub import hub_offline

    if hub_offline():
        raise DataUnavailableError(f"{task}: --download needs the hub for {repo}, and HF_HUB_OFFLINE is set")
    try:
        call()
    except Exception as exc:  # the hub's, datasets' and fsspec's errors have many types
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise DataUnavailableError(f"{task}: the hub dataset {repo} did not download ({reason})") from None


def fetch(client: Any, url: str, target: Path, *, md5: str | None = None, show_progress: bool = True) -> Path:
    """``url`` streamed to ``target`` (through ``target.part``, renamed once whole and, with ``md5``, checked).

    Raises:
        DataUnavailableError: the host did not answer, refused (its HTTP status), the connection broke, or the
            MD5 is not ``md5``.
    """
    import httpx
    from tqdm import tqdm

    part = target.with_name(target.name + ".part")
    try:
        with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise DataUnavailableError(f"{url}: HTTP {response.status_code} (the download was refused)")
            total = int(response.headers.get("content-length") or 0) or None
            with (
                part.open("wb") as out,
                tqdm(total=total, unit="B", unit_scale=True, desc=target.name, disable=not show_progress) as bar,
            ):
                for chunk in response.iter_bytes(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    except httpx.HTTPError as exc:
        part.unlink(missing_ok=True)
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise DataUnavailableError(f"{url}: could not download ({reason}); --download needs the network") from None
    if md5 is not None:
        _checked(part, md5, url)
    part.replace(target)
    return target


def md5_of(path: Path) -> str:
    """The hex MD5 of ``path``'s bytes (as eva's integrity check computes it)."""
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checked(path: Path, md5: str | None, url: str) -> None:
    if md5 is None:
        return
    got = md5_of(path)
    if got != md5:
        path.unlink(missing_ok=True)
        raise DataUnavailableError(f"{url}: the file's MD5 is {got}, not eva's {md5} (removed; run again)")
