"""Imported first by cli.py, before click: `herder run` starts its master's interpreter here,
which loads while click and the configuration do and runs nothing until it is handed the
validated configuration (herder.common.config.prestart has how, and when it does not). Its import
is its whole job."""

import sys

from herder.common.config import prestart

prestart.begin(sys.argv)
