"""What the `ppd` subcommands' parsers share: argparse types that refuse a bad value at parse
time, in words (`types`)."""
