"""Field help for humans, generated from the schema's docstrings."""

from pydantic import BaseModel

from tuneforge.config.schema import RunConfig, section_type


def field_rows(
    model: type[BaseModel] = RunConfig, prefix: str = ""
) -> list[tuple[str, str, str, str]]:
    """(dotted path, type, default, help) for every field; nested sections expanded in order."""
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        section = section_type(field.annotation)
        if section is field.annotation:
            rows += field_rows(section, path + ".")
            continue
        type_name = str(field.annotation).replace("typing.", "").replace("pathlib.", "")
        if isinstance(field.annotation, type):
            type_name = field.annotation.__name__
        default = (
            "required"
            if field.is_required()
            else repr(field.get_default(call_default_factory=True))
        )
        rows.append((path, type_name, default, field.description or ""))
        if section is not None:
            rows += field_rows(section, path + "[].")
    return rows
