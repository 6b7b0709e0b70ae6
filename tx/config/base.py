"""Frozen, typed, validated config dataclasses with dotted overrides.

Every config in tx is a frozen dataclass decorated with `@config`. Fields may be
plain values (int, float, str, bool, Optional, tuple) or nested configs. Allowed
values of a string field are declared with `choice(...)`; cross-field rules go in
a `validate(self)` method that raises `ConfigError` naming the field.

    @config
    class MoEConfig:
        num_experts: int = 0
        router: str = choice("softmax", "sigmoid")

    cfg = override(ModelConfig(), {"moe.num_experts": 4, "d_model": "512"})

Overrides are parsed as Python literals (`ast.literal_eval`, never `eval`); a
string that is not a literal stays a string.
"""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from typing import Any, Mapping


class ConfigError(ValueError):
  """A user-facing config problem; its message is one line naming key and fix."""


def config(cls):
  """Turns `cls` into a frozen dataclass whose construction validates every field."""
  user_post_init = cls.__dict__.get('__post_init__')

  def __post_init__(self):
    _check_fields(self)
    if user_post_init is not None:
      user_post_init(self)
    if hasattr(self, 'validate'):
      self.validate()

  cls.__post_init__ = __post_init__
  cls.replace = lambda self, **kw: dataclasses.replace(self, **kw)
  return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


def choice(*allowed: str, default: str | None = None):
  """A string field restricted to `allowed`; the default is the first option."""
  return dataclasses.field(
      default=allowed[0] if default is None else default,
      metadata={'choices': tuple(allowed)})


def nested(cls):
  """A field holding a nested config, default-constructed."""
  return dataclasses.field(default_factory=cls)


def is_config(obj) -> bool:
  return dataclasses.is_dataclass(obj) and hasattr(type(obj), 'replace')


def _type_name(tp) -> str:
  return getattr(tp, '__name__', str(tp)).replace('typing.', '')


def _coerce(value, tp, key: str):
  """Returns `value` as type `tp` or raises ConfigError naming `key`."""
  origin = typing.get_origin(tp)
  if tp is Any:
    return value
  if origin in (typing.Union, types.UnionType):
    args = typing.get_args(tp)
    if value is None and type(None) in args:
      return None
    errors = []
    for arg in args:
      if arg is type(None):
        continue
      try:
        return _coerce(value, arg, key)
      except ConfigError as e:
        errors.append(e)
    raise errors[0] if errors else ConfigError(f'{key}: None is not allowed')
  if origin is tuple:
    if not isinstance(value, (tuple, list)):
      raise ConfigError(f'{key}: expected a tuple, got {value!r}')
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_coerce(v, args[0], f'{key}[{i}]') for i, v in enumerate(value))
    if args and len(args) != len(value):
      raise ConfigError(f'{key}: expected {len(args)} values, got {value!r}')
    return tuple(_coerce(v, a, f'{key}[{i}]') for i, (v, a) in enumerate(zip(value, args)))
  if isinstance(tp, type) and dataclasses.is_dataclass(tp):
    if isinstance(value, tp):
      return value
    if isinstance(value, Mapping):
      return from_dict(tp, value, prefix=key + '.')
    raise ConfigError(f'{key}: expected a {tp.__name__} mapping, got {value!r}')
  if tp is bool:
    if isinstance(value, bool):
      return value
    raise ConfigError(f'{key}: expected true/false (a bool), got {value!r}')
  if tp is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
    raise ConfigError(f'{key}: expected an integer, got {value!r}')
  if tp is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
    raise ConfigError(f'{key}: expected a number, got {value!r}')
  if tp is str:
    if isinstance(value, str):
      return value
    raise ConfigError(f'{key}: expected a string, got {value!r}')
  if isinstance(tp, type) and not isinstance(value, tp):
    raise ConfigError(f'{key}: expected {_type_name(tp)}, got {value!r}')
  return value


def _hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _check_fields(obj, prefix: str = ''):
  prefix = prefix or getattr(type(obj), 'PREFIX', '')
  hints = _hints(type(obj))
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    key = prefix + f.name
    coerced = _coerce(value, hints[f.name], key)
    if coerced is not value:
      object.__setattr__(obj, f.name, coerced)
    choices = f.metadata.get('choices')
    if choices and coerced not in choices:
      raise ConfigError(
          f'{key}: {coerced!r} is not one of {", ".join(map(str, choices))}')


def fail(key: str, message: str):
  """Raises the one-line ConfigError for `key`."""
  raise ConfigError(f'{key}: {message}')


def to_dict(cfg) -> dict[str, Any]:
  """The config as nested plain dicts (JSON-friendly; tuples become lists)."""
  out = {}
  for f in dataclasses.fields(cfg):
    value = getattr(cfg, f.name)
    if is_config(value):
      value = to_dict(value)
    elif isinstance(value, tuple):
      value = list(value)
    out[f.name] = value
  return out


def from_dict(cls, data: Mapping[str, Any], prefix: str = ''):
  """Builds `cls` from nested dicts, rejecting unknown keys by name."""
  prefix = prefix or getattr(cls, 'PREFIX', '')
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(data) - names)
  if unknown:
    raise ConfigError(
        f'{prefix}{unknown[0]}: unknown key; allowed keys are {", ".join(sorted(names))}')
  hints = _hints(cls)
  kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
  try:
    return cls(**kwargs)
  except ConfigError as e:
    if prefix and not str(e).startswith(prefix):
      raise ConfigError(prefix + str(e)) from None
    raise


def parse_literal(text: str):
  """Parses an override value as a Python literal; non-literals stay strings."""
  lowered = text.strip().lower()
  if lowered in ('true', 'false'):
    return lowered == 'true'
  if lowered in ('none', 'null'):
    return None
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def override(cfg, overrides: Mapping[str, Any]):
  """Returns `cfg` with dotted-key overrides applied and everything re-validated.

  Values that are strings are parsed as literals against the field's type first, so
  command-line text (`'512'`, `'True'`, `'(0.9, 0.98)'`) and Python values both work,
  and a string field keeps text that would parse as something else (`position=none`).
  """
  data = to_dict(cfg)
  root = getattr(type(cfg), 'PREFIX', '')
  for key, value in overrides.items():
    node, parts = data, key.split('.')
    cls = type(cfg)
    for depth, part in enumerate(parts):
      where = root + '.'.join(parts[:depth + 1])
      fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
      if part not in fields:
        prefix = root + '.'.join(parts[:depth])
        allowed = ', '.join(prefix.rstrip('.') + '.' + n if prefix else n for n in sorted(fields))
        raise ConfigError(f'{where}: unknown key; allowed keys are {allowed}')
      if depth == len(parts) - 1:
        node[part] = _parse_for(value, _hints(cls)[part]) if isinstance(value, str) else value
      else:
        sub = _hints(cls)[part]
        if not (isinstance(sub, type) and dataclasses.is_dataclass(sub)):
          raise ConfigError(f'{where}: is a value, not a section; use {where}=VALUE')
        node, cls = node[part], sub
  return from_dict(type(cfg), data)


def _parse_for(text: str, tp):
  """`text` parsed as a literal, unless the field takes a string and the literal does not
  fit it (`'none'` or `'512'` for a `str` field stay text)."""
  parsed = parse_literal(text)
  if parsed is text:
    return text
  try:
    _coerce(parsed, tp, '')
    return parsed
  except ConfigError:
    try:
      _coerce(text, tp, '')
      return text
    except ConfigError:
      return parsed  # neither fits: let validation name the key and the parsed value


def parse_overrides(pairs: list[str]) -> dict[str, str]:
  """Splits command-line `key=value` strings into an override mapping of raw text.

  The values stay text: `override` parses each against its field's type.
  """
  out = {}
  for pair in pairs:
    if '=' not in pair:
      raise ConfigError(f'{pair}: an override must look like key=value, e.g. model.d_model=256')
    key, value = pair.split('=', 1)
    if not key.strip():
      raise ConfigError(f'{pair!r}: an override needs a key before the =, e.g. model.d_model=256')
    out[key.strip()] = value
  return out


def flatten(cfg, prefix: str = '') -> dict[str, Any]:
  """All leaf values of a config under their dotted keys."""
  out = {}
  for f in dataclasses.fields(cfg):
    value = getattr(cfg, f.name)
    if is_config(value):
      out.update(flatten(value, prefix + f.name + '.'))
    else:
      out[prefix + f.name] = value
  return out


def flatten_dict(d: dict, prefix: str = '') -> dict[str, Any]:
  """Nested plain dicts (e.g. a config.json) -> {dotted key: leaf}."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten_dict(v, f'{prefix}{k}.'))
    else:
      out[prefix + k] = v
  return out
