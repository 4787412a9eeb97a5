"""The torch reference implementations, each registered against its settings class; each
settings class names its module (`implemented_in`), imported when the method is first built."""
