"""Moved: `vitlab demo` lives in `vitlab.paper.demo` (`run_demo`), where it runs through the same sub-runs, transfer
task and report page as `vitlab reproduce` (issue 36). Importing a name from here says where it went."""


def __getattr__(name: str) -> object:
    if name.startswith("__"):  # module protocol look-ups (__path__, __all__, ...): not there, as for any module
        raise AttributeError(name)
    raise ImportError(f"vitlab.train.demo.{name} has moved: the demo is vitlab.paper.demo (from vitlab.paper.demo "
                      f"import run_demo; vitlab.paper.demo_page draws its page)")
