"""The table catalogue (pipelines/tables.py) and its generated documentation agree."""

from pathlib import Path

from pipelines.tables import TABLES, VIEWS, views_doc

ROOT = Path(__file__).resolve().parents[2]


def test_docs_views_md_is_generated_from_the_catalogue():
    doc = ROOT / "docs" / "views.md"
    assert doc.read_text() == views_doc(), (
        "docs/views.md is stale: python -c 'from pipelines.tables import views_doc; "
        'print(views_doc(), end="")\' > docs/views.md'
    )


def test_every_key_is_a_column_and_every_view_is_a_table():
    for t in TABLES.values():
        assert set(t.keys) <= set(t.columns), t.name
        assert set(t.partition_by) <= set(t.columns), t.name
    assert set(VIEWS) <= set(TABLES)


def test_every_derived_view_has_its_derivation_over_stored_tables():
    from pipelines.derived import DERIVE

    derived = {name for name, t in TABLES.items() if not t.stored}
    assert set(DERIVE) == derived
    for name in derived:
        assert all(TABLES[s].stored for s in TABLES[name].derived_from), name
