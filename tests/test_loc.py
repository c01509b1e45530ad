"""Lines of code per kernel (attention_kernels.compare.loc): the counting rules on files of known counts,
and the table on the book's own files, with and without the peers' sources."""
import textwrap

from attention_kernels.compare import loc

PYTHON_FIXTURE = textwrap.dedent('''\
    """Module docstring
    over two lines."""
    import triton  # a comment after code counts

    SCALE = 2

    # a comment alone


    @triton.jit
    def _kernel(x_ptr, n):
        """Docstring."""
        # comment
        i = 0
        return i


    def launch(x):
        """Launch.

        More.
        """
        _kernel[(1,)](x, 1)
        return x


    def _builder(T):
        @T.prim_func
        def main(a):
            pass
        return main


    class Fn:
        "a one-line docstring"
        def f(self):
            return (1,
                    2)
    ''')

C_FIXTURE = textwrap.dedent('''\
    // a line comment
    #include <cuda.h>  // after code
    /* a block
       comment */
    __global__ void k(const char* s) {
        const char* url = "http://a//b";  /* inline */ int x = 1;

        /* alone */
    }
    ''')


def test_python_counts_code_lines_and_splits_device_from_host(tmp_path):
    """Docstrings, comments and blank lines are not counted. kernel: the jit function (decorator, def and
    two statements) and the TileLang-style builder holding a prim_func (5 lines); host: launch (3) and the
    class (4); total adds the import and the constant."""
    path = tmp_path / "fixture.py"
    path.write_text(PYTHON_FIXTURE)
    assert loc.count_python(path) == loc.Lines(kernel=4 + 5, host=3 + 4, total=9 + 7 + 2)


def test_c_counts_lines_left_once_comments_are_removed(tmp_path):
    """A // inside a string is not a comment; a line holding only a comment is not counted."""
    path = tmp_path / "fixture.cu"
    path.write_text(C_FIXTURE)
    assert loc.count_c(path) == 4


def test_the_books_kernels_are_counted_in_every_language(monkeypatch):
    """Without the peers' sources their rows read n/a and the book's rows are still counted: positive,
    device plus host within the file, and fewer lines than the file's non-blank ones (docstrings and
    comments left out)."""
    monkeypatch.setattr(loc, "peer_folder", lambda peer: None)
    table = loc.loc_table()
    book = table.xs("book", level="source")
    assert set(table.xs("MLA decode").index.get_level_values("language")) >= {"Triton", "Gluon", "TileLang"}
    assert set(table.xs("GLA chunk prefill").index.get_level_values("language")) == {"Triton", "TileLang"}
    for (kernel, language), row in book.iterrows():
        assert 0 < row["kernel lines"] and 0 < row["host lines"], (kernel, language)
        assert row["kernel lines"] + row["host lines"] <= row["all lines"], (kernel, language)
    peers = table.drop("book", level="source")
    assert len(peers) and (peers[["kernel lines", "host lines", "all lines"]] == "n/a").all().all()
    for source in loc.SOURCES:
        if source.where == "book":
            for f in source.python:
                nonblank = sum(1 for line in (loc.ROOT / f).read_text().splitlines() if line.strip())
                assert loc.count_python(loc.ROOT / f).total < nonblank, f


def test_a_peer_is_counted_where_its_files_are(tmp_path, monkeypatch):
    """A peer's folder holding its files gives numbers; one missing a file gives n/a, not an error."""
    ssd = next(s for s in loc.SOURCES if s.where == "mamba_ssm" and s.kernel == "Mamba-2 decode step")
    (tmp_path / ssd.python[0]).parent.mkdir(parents=True)
    (tmp_path / ssd.python[0]).write_text(PYTHON_FIXTURE)
    monkeypatch.setenv("MAMBA_SSM_PATH", str(tmp_path))
    assert loc.count(ssd) == loc.Lines(kernel=9, host=7, total=18)
    other = next(s for s in loc.SOURCES if s.where == "mamba_ssm" and s is not ssd)
    assert loc.count(other) is None


def test_the_closing_chapter_shows_the_books_counts_of_today(monkeypatch):
    """The side-by-side chapter's table (a committed output: its peers' rows need their sources) holds the
    book's rows as the package counts them now, so that a kernel edited since does not leave a stale count."""
    import json
    import re
    monkeypatch.setattr(loc, "peer_folder", lambda peer: None)
    book = loc.loc_table().xs("book", level="source")
    chapter = json.loads((loc.ROOT / "book" / "families_side_by_side.ipynb").read_text())
    cell = next(c for c in chapter["cells"] if c["cell_type"] == "code" and "loc_table()" in "".join(c["source"]))
    html = "".join(cell["outputs"][0]["data"]["text/html"])
    shown = [tuple(int(n) for n in re.findall(r"<td>(\d+)</td>", row))
             for row in re.findall(r"<th>book</th>(.*?)</tr>", html, flags=re.S)]
    now = [tuple(int(row[c]) for c in ("kernel lines", "host lines", "all lines", "files")) for _, row in book.iterrows()]
    assert shown == now, "book/families_side_by_side.ipynb's lines-of-code table is stale: rerun its cell"
