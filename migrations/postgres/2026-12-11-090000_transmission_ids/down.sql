DROP TABLE transmissions;
