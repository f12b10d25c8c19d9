"""One adapter per Ansible module, named as the module (plugins/modules/NAME.py imports
gpuprov.modules.NAME): its argument spec and rules, its read-and-plan step, and how its result is
reported; ``common`` is what every module does with a plan (check mode, --diff, refusals, apply).
The plugin files hold the documentation and call these."""
