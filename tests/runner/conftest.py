"""pytester for the runner's end-to-end tests."""


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("pytester"):
        config.pluginmanager.import_plugin("pytester")
