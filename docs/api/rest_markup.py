"""A Griffe extension for the API reference: the docstrings' reST markup, as Markdown.

The library's docstrings cross-reference with Sphinx roles (``:class:`X```,
``:meth:``, ``:func:``, ``:mod:``, ``:data:``, ``:attr:``, ``:exc:``) and
introduce code with reST's literal blocks (a paragraph ending in ``::``, then
an indented block), which mkdocstrings renders as Markdown: the roles showed
raw and the ``::`` literally. Rather than rewrite every docstring, this
extension rewrites each docstring once Griffe has loaded its package:

* a role becomes an autorefs cross-reference, marked optional: a link where
  the object is on the site, else its name as code (``~`` keeps the last
  dotted part as the title, as in Sphinx; ``Title <target>`` keeps the title);
  a name relative to the docstring's module or class is resolved by Griffe;
* a literal block becomes a fenced code block (Python where it holds Python,
  else plain), and its ``::`` a single ``:`` (dropped when it stands alone);
* a doctest directive (``# doctest: +SKIP``) is dropped from an example: it is
  for the doctest runner, not the reader;
* a parameter's default that names a module's constant (``DEFAULT_ALGORITHM``)
  shows the constant's value (``'ring'``), where the value is a plain literal
  or a bound declared as ``settings.Seconds(value, help, ...)`` (its value);
* such a bound, where the page shows it, reads as its value with its help as
  its docstring (:mod:`commrt.settings` declares a bound's meaning in the call).

mkdocs.yml loads it after :mod:`package_dirs`, so the packages that setuptools
maps from other folders are rewritten too. Build code for the docs, not part
of the library; mkdocs.yml keeps it out of the site.
"""

from __future__ import annotations

import re
import textwrap

import griffe

#: a Sphinx role: its kind, an optional ``~``, and the target (``Title <target>`` too)
ROLE = re.compile(
    r":(?:py:)?(?P<kind>class|meth|func|mod|data|attr|exc|obj|const):"
    r"`(?P<short>~?)(?P<text>[^`<]+?)(?:\s*<(?P<target>[^>`]+)>)?`"
)
#: the line that opens a literal block: text ending in "::" (or "::" alone)
OPENS = re.compile(r"^(?P<indent>\s*)(?P<text>.*?)::\s*$")
#: a doctest directive at the end of an example's line, with the spaces before it
DOCTEST = re.compile(r"[ \t]*#\s*doctest:\s*[+-]\w+(?:\s*,\s*[+-]\w+)*[ \t]*$", re.MULTILINE)
#: a default shown as its value: a number, a string, True, False or None
LITERAL = re.compile(r"""^(-?[\d_.]+(?:e-?\d+)?|'[^'\\]*'|"[^"\\]*"|True|False|None)$""")
PYTHON = re.compile(r"^\s*(>>>|import |from \w|def |class |with |for |\w+ = )", re.MULTILINE)


def cross_reference(match: re.Match, obj: griffe.Object) -> str:
    """The autorefs marker for one role in ``obj``'s docstring."""
    text = match["text"].strip()
    target = (match["target"] or text).strip().rstrip("()")
    title = text if match["target"] else target
    if match["short"]:
        title = title.rsplit(".", 1)[-1]
    if match["kind"] in ("meth", "func"):
        title += "()"
    identifier = resolve(obj, target)
    return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'


def resolve(obj: griffe.Object, name: str) -> str:
    """``name``'s full path as seen from ``obj`` (its scope, then its parents'), else
    ``name`` itself."""
    head, _, rest = name.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            found = scope.resolve(head)
        except (griffe.NameResolutionError, AttributeError, KeyError):
            scope = scope.parent
            continue
        return f"{found}.{rest}" if rest else found
    return name


def fence_literal_blocks(text: str) -> str:
    """Each reST literal block of ``text`` as a fenced code block."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        opens = OPENS.match(lines[i])
        block_at = i + 1
        while block_at < len(lines) and not lines[block_at].strip():
            block_at += 1
        indent = len(opens["indent"]) if opens else 0
        if opens is None or block_at >= len(lines) or _indent(lines[block_at]) <= indent:
            out.append(lines[i])
            i += 1
            continue
        end = block_at
        while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > indent):
            end += 1
        body = textwrap.dedent("\n".join(lines[block_at:end])).strip("\n")
        if opens["text"].strip():
            out += [f"{opens['indent']}{opens['text'].rstrip()}:", ""]
        fence = opens["indent"] + "```"
        out += [fence + ("python" if PYTHON.search(body) else "text")]
        out += [opens["indent"] + line if line else "" for line in body.splitlines()]
        out += [fence, ""]
        i = end
    return "\n".join(out)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def constant_value(obj: griffe.Object, default) -> str | None:
    """The literal value of the constant that ``default`` (a parameter's default in
    ``obj``) names, else None (not a name, not found, or not a plain literal)."""
    if not isinstance(default, griffe.ExprName):
        return None
    try:
        found = obj.modules_collection.get_member(default.canonical_path)
        while found.is_alias:
            found = found.target
    except (griffe.AliasResolutionError, griffe.CyclicAliasError, KeyError, AttributeError):
        return None
    value = seconds_value(getattr(found, "value", None)) if found.is_attribute else None
    return str(value) if value is not None and LITERAL.match(str(value)) else None


def is_seconds(value) -> bool:
    """Whether ``value`` (an attribute's value) is a ``Seconds(...)`` declaration."""
    function = getattr(value, "function", None)
    return function is not None and str(function).split(".")[-1] == "Seconds"


def seconds_value(value):
    """A ``Seconds(value, help, ...)`` declaration's value; any other value as it is."""
    return value.arguments[0] if is_seconds(value) and value.arguments else value


def show_declared_bound(obj: griffe.Attribute) -> None:
    """A module's ``NAME_S = Seconds(value, help, applies, group)`` as ``value``, its help
    the docstring."""
    if not is_seconds(obj.value) or len(obj.value.arguments) < 3:
        return
    value, help_, applies = obj.value.arguments[:3]
    if obj.docstring is None:
        quotes = "\"'"
        text = f"{str(help_).strip(quotes)} ({str(applies).strip(quotes)})"
        obj.docstring = griffe.Docstring(text, parent=obj)
    obj.value = value


def show_constant_defaults(obj: griffe.Function) -> None:
    """Each parameter default of ``obj`` (a function) that names a constant, as its value."""
    for parameter in obj.parameters:
        value = constant_value(obj, parameter.default)
        if value is not None:
            parameter.default = value


def rewrite(obj: griffe.Object) -> None:
    """Rewrite ``obj``'s docstring and its members' (aliases are their targets' business)."""
    if obj.docstring is not None and not getattr(obj.docstring, "rewritten", False):
        value = DOCTEST.sub("", fence_literal_blocks(obj.docstring.value))
        obj.docstring.value = ROLE.sub(lambda m: cross_reference(m, obj), value)
        obj.docstring.rewritten = True
    if obj.is_function:
        show_constant_defaults(obj)
    elif obj.is_attribute and obj.parent is not None and obj.parent.is_module:
        show_declared_bound(obj)
    elif obj.is_attribute and obj.parent is not None and obj.parent.is_class:
        # a dataclass field's default: its __init__'s parameter is made from it
        value = constant_value(obj, obj.value)
        if value is not None:
            obj.value = value
    for member in obj.members.values():
        if not member.is_alias:
            rewrite(member)


class RestMarkup(griffe.Extension):
    """Rewrite a package's docstrings once it is loaded (module docs)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        rewrite(pkg)
