"""`DataError`: the one exception tx/data raises for problems the user can fix."""


class DataError(ValueError):
  """A user-fixable data problem (missing, empty or undecodable file, bad setting).

  The message is one line that names the file or `data.*` setting and says how to
  fix it, e.g. `data.files: /x/a.txt is empty; point data.files at a non-empty
  text file`.
  """
